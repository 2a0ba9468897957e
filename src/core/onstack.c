/* onstack.c - run a function on a stack of the library's own (onstack.h). */
#include "onstack.h"

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

/* switch_call(fn, arg, top): call fn(arg) with the stack pointer at top
 * (16-byte aligned), then come back to the caller's stack. */
#if defined(__x86_64__)
#define FA_HAVE_SWITCH 1
__asm__(".text\n"
        ".p2align 4\n"
        ".globl fa_onstack_switch_call\n"
        ".hidden fa_onstack_switch_call\n"
        ".type fa_onstack_switch_call, @function\n"
        "fa_onstack_switch_call:\n"
        "  .cfi_startproc\n"
        "  pushq %rbp\n"
        "  .cfi_def_cfa_offset 16\n"
        "  .cfi_offset %rbp, -16\n"
        "  movq %rsp, %rbp\n"
        "  .cfi_def_cfa_register %rbp\n"
        "  movq %rdx, %rsp\n"
        "  movq %rdi, %rax\n"
        "  movq %rsi, %rdi\n"
        "  callq *%rax\n"
        "  movq %rbp, %rsp\n"
        "  popq %rbp\n"
        "  .cfi_def_cfa %rsp, 8\n"
        "  ret\n"
        "  .cfi_endproc\n"
        ".size fa_onstack_switch_call, .-fa_onstack_switch_call\n");
#elif defined(__aarch64__)
#define FA_HAVE_SWITCH 1
__asm__(".text\n"
        ".p2align 2\n"
        ".globl fa_onstack_switch_call\n"
        ".hidden fa_onstack_switch_call\n"
        ".type fa_onstack_switch_call, %function\n"
        "fa_onstack_switch_call:\n"
        "  .cfi_startproc\n"
        "  stp x29, x30, [sp, #-16]!\n"
        "  .cfi_def_cfa_offset 16\n"
        "  .cfi_offset x29, -16\n"
        "  .cfi_offset x30, -8\n"
        "  mov x29, sp\n"
        "  .cfi_def_cfa_register x29\n"
        "  mov sp, x2\n"
        "  mov x3, x0\n"
        "  mov x0, x1\n"
        "  blr x3\n"
        "  mov sp, x29\n"
        "  .cfi_def_cfa sp, 16\n"
        "  ldp x29, x30, [sp], #16\n"
        "  .cfi_def_cfa_offset 0\n"
        "  .cfi_restore x29\n"
        "  .cfi_restore x30\n"
        "  ret\n"
        "  .cfi_endproc\n"
        ".size fa_onstack_switch_call, .-fa_onstack_switch_call\n");
#endif

#ifdef FA_HAVE_SWITCH
void fa_onstack_switch_call(void (*fn)(void *), void *arg, void *top);

bool fa_on_stack(void (*fn)(void *), void *arg)
{
    const size_t guard = 4096, len = FA_ONSTACK_SIZE + guard;
    int saved = errno;
    /* tcmalloc exports mmap (its hooks): the kernel's is called directly. */
    void *m = (void *)syscall(SYS_mmap, NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                              -1, 0);
    if (m == MAP_FAILED || syscall(SYS_mprotect, m, guard, PROT_NONE) != 0) {
        if (m != MAP_FAILED)
            syscall(SYS_munmap, m, len);
        errno = saved;
        fn(arg);
        return false;
    }
    fa_onstack_switch_call(fn, arg, (char *)m + len);
    syscall(SYS_munmap, m, len);
    errno = saved;
    return true;
}
#else
bool fa_on_stack(void (*fn)(void *), void *arg)
{
    fn(arg);
    return false;
}
#endif
