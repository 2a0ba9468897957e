/* test_onstack.c - running a function on a stack of the library's own
 * (onstack.c): it runs there, deep enough for a dump, with its argument;
 * errno comes back as it was; nothing is left mapped; and a signal
 * handler that uses it on a small sigaltstack leaves the guard below that
 * stack untouched. */
#define _GNU_SOURCE
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "onstack.h"

struct probe {
    uintptr_t sp;
    int arg_seen;
    unsigned char sum;
};

/* Takes about 40 KiB of stack: each frame's buffer is read by the next
 * call down, so it stays live (no loop can replace the recursion). */
static unsigned char deep_from(int n, const volatile unsigned char *up)
{
    volatile unsigned char b[1024];
    for (size_t i = 0; i < sizeof b; i++)
        b[i] = (unsigned char)(i + n + (up ? up[i] : 0));
    unsigned char below = n ? deep_from(n - 1, b) : 0;
    return (unsigned char)(below + b[n]);
}
static unsigned char deep(int n) { return deep_from(n, NULL); }

static void probe_fn(void *arg)
{
    struct probe *p = arg;
    volatile char here = 0;
    p->sp = (uintptr_t)&here;
    p->arg_seen = 1;
    p->sum = deep(40);
    errno = EBADF; /* the function's own errno does not leak out */
}

static bool maps_mention(uintptr_t addr)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    bool found = false;
    while (f && fgets(line, sizeof line, f)) {
        unsigned long a, b;
        if (sscanf(line, "%lx-%lx", &a, &b) == 2 && addr >= a && addr < b)
            found = true;
    }
    if (f)
        fclose(f);
    return found;
}

static void test_runs_on_its_own_stack(void **state)
{
    (void)state;
    struct probe p = {0};
    volatile char mine = 0;
    errno = ENOENT;
    bool own = fa_on_stack(probe_fn, &p);
    assert_int_equal(errno, ENOENT);
    assert_true(p.arg_seen);
    assert_int_equal(p.sum, deep(40));
#if defined(__x86_64__) || defined(__aarch64__)
    assert_true(own);
    uintptr_t here = (uintptr_t)&mine;
    uintptr_t dist = here > p.sp ? here - p.sp : p.sp - here;
    assert_true(dist > FA_ONSTACK_SIZE); /* not on this thread's stack */
    assert_false(maps_mention(p.sp));    /* unmapped after the call */
#else
    assert_false(own);
    (void)mine;
#endif
}

/* A handler on an 8 KiB sigaltstack with a guard below it calls
 * fa_on_stack for 40 KiB of work: the guard stays untouched. */
#define ALT 8192
static unsigned char *alt_region; /* guard page, then the sigaltstack */
static struct probe in_handler;

static void on_usr1(int sig)
{
    (void)sig;
    fa_on_stack(probe_fn, &in_handler);
}

static void test_handler_on_small_altstack(void **state)
{
    (void)state;
#if defined(__x86_64__) || defined(__aarch64__)
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t alt = ALT > page ? ALT : page;
    alt_region = mmap(NULL, page + alt, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(alt_region != MAP_FAILED);
    assert_int_equal(mprotect(alt_region, page, PROT_NONE), 0); /* an overflow would fault */
    stack_t ss = {.ss_sp = alt_region + page, .ss_size = alt, .ss_flags = 0}, old;
    assert_int_equal(sigaltstack(&ss, &old), 0);
    struct sigaction sa, prev;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    assert_int_equal(sigaction(SIGUSR1, &sa, &prev), 0);
    raise(SIGUSR1);
    assert_true(in_handler.arg_seen);
    assert_int_equal(in_handler.sum, deep(40));
    sigaction(SIGUSR1, &prev, NULL);
    sigaltstack(&old, NULL);
    munmap(alt_region, page + alt);
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_runs_on_its_own_stack),
        cmocka_unit_test(test_handler_on_small_altstack),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
