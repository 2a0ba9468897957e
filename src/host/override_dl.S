/* override_dl.S - dlsym and dlvsym: ask lookup.c where the call goes, then
 * jump there with the arguments and the stack as they came.
 *
 * glibc's dlsym and dlvsym read their return address to know whose
 * RTLD_NEXT and RTLD_DEFAULT they serve: a wrapper that called them would
 * make every RTLD_NEXT lookup start after forgealloc instead of after its
 * caller.  A jump keeps the caller's return address; C cannot promise one
 * (GCC 12 has no musttail), so these few instructions are assembly.  The
 * preload test "lookup_tail" checks the built code: each ends in an
 * indirect jump and never returns by itself.
 *
 * On other architectures neither name is defined: lookups through a handle
 * on libc then find glibc's functions, as without forgealloc. */

/* Built with -fcf-protection: a landing pad for indirect branches, and
 * (cet.h) the note that marks the object as built so. */
#if defined(__CET__) && defined(__has_include)
#if __has_include(<cet.h>)
#include <cet.h>
#endif
#endif
#if defined(__CET__) && (__CET__ & 1)
#define FA_ENTRY endbr64
#else
#define FA_ENTRY
#endif

#if defined(__x86_64__) && defined(__LP64__)

/* On entry %rsp is 8 past a multiple of 16: three pushes align it for the
 * call. */
#define FA_ROUTE(name, route)                                                  \
    .text;                                                                     \
    .globl name;                                                               \
    .type name, @function;                                                     \
    .p2align 4;                                                                \
name:                                                                          \
    .cfi_startproc;                                                            \
    FA_ENTRY;                                                                  \
    pushq %rdi;                                                                \
    .cfi_adjust_cfa_offset 8;                                                  \
    pushq %rsi;                                                                \
    .cfi_adjust_cfa_offset 8;                                                  \
    pushq %rdx;                                                                \
    .cfi_adjust_cfa_offset 8;                                                  \
    call route;                                                                \
    popq %rdx;                                                                 \
    .cfi_adjust_cfa_offset -8;                                                 \
    popq %rsi;                                                                 \
    .cfi_adjust_cfa_offset -8;                                                 \
    popq %rdi;                                                                 \
    .cfi_adjust_cfa_offset -8;                                                 \
    jmp *%rax;                                                                 \
    .cfi_endproc;                                                              \
    .size name, .-name

FA_ROUTE(dlsym, fa_lookup_route_sym)
FA_ROUTE(dlvsym, fa_lookup_route_vsym)

#elif defined(__aarch64__)

#if defined(__ARM_FEATURE_BTI_DEFAULT)
#define FA_BTI bti c
#else
#define FA_BTI
#endif

/* x0-x2 and the frame record (x29, x30) kept across the call; x16 is the
 * intra-procedure scratch register a branch through a veneer may use. */
#define FA_ROUTE(name, route)                                                  \
    .text;                                                                     \
    .globl name;                                                               \
    .type name, %function;                                                     \
    .p2align 4;                                                                \
name:                                                                          \
    .cfi_startproc;                                                            \
    FA_BTI;                                                                    \
    stp x29, x30, [sp, #-48]!;                                                 \
    .cfi_def_cfa_offset 48;                                                    \
    .cfi_offset 29, -48;                                                       \
    .cfi_offset 30, -40;                                                       \
    mov x29, sp;                                                               \
    stp x0, x1, [sp, #16];                                                     \
    str x2, [sp, #32];                                                         \
    bl route;                                                                  \
    mov x16, x0;                                                               \
    ldp x0, x1, [sp, #16];                                                     \
    ldr x2, [sp, #32];                                                         \
    ldp x29, x30, [sp], #48;                                                   \
    .cfi_restore 29;                                                           \
    .cfi_restore 30;                                                           \
    .cfi_def_cfa_offset 0;                                                     \
    br x16;                                                                    \
    .cfi_endproc;                                                              \
    .size name, .-name

FA_ROUTE(dlsym, fa_lookup_route_sym)
FA_ROUTE(dlvsym, fa_lookup_route_vsym)

#endif

/* No executable stack for the library. */
#if defined(__linux__) && defined(__ELF__)
.section .note.GNU-stack, "", %progbits
#endif
