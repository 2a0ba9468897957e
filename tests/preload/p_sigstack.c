/* p_sigstack.c - how much stack the signal dump takes.
 *
 *   p_sigstack stack SIZE     a child runs a function on a stack of its own
 *                             of SIZE bytes (makecontext), with a guard
 *                             below it; SIGTERM (SIG_DFL: the shim's dump
 *                             handler) arrives while it runs there
 *   p_sigstack altstack SIZE  a child's SIGUSR1 handler runs on the
 *                             program's sigaltstack (SA_ONSTACK) of SIZE
 *                             bytes, with a guard below it; SIGTERM arrives
 *                             while it runs there, so its delivery nests on
 *                             that stack
 *
 * The stacks are shared with the parent (MAP_SHARED) and filled with a
 * pattern, so the parent can see what the child touched after it died.
 * The parent prints the depth used (the kernel's signal frames included)
 * and exits 0 when the child died of SIGTERM and the guard is untouched,
 * 1 otherwise; it leaves with _exit, so only the child dumps.  Without the
 * shim SIGTERM kills at once: the depth is what the program itself used.
 * Linked with -z now: no lazy binding (which saves the vector registers on
 * the stack) runs on the small stacks. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

#define GUARD ((size_t)64 * 1024)
#define PATTERN 0xa5

struct shared {
    uintptr_t handler_sp; /* where the SIGUSR1 handler's frame is (altstack mode) */
};

static struct shared *sh;
static char *region; /* guard, then the stack; the stack ends at the region's end */
static size_t size;

static void terminate_self(void) { syscall(SYS_tgkill, getpid(), gettid(), SIGTERM); }

static ucontext_t main_ctx, small_ctx;

static void on_small_stack(void)
{
    terminate_self();
    _exit(3); /* not reached: the signal kills */
}

static void on_usr1(int sig)
{
    (void)sig;
    volatile char here = 0;
    sh->handler_sp = (uintptr_t)&here;
    terminate_self();
}

static void child(const char *mode)
{
    char *stack = region + GUARD;
    if (strcmp(mode, "stack") == 0) {
        getcontext(&small_ctx);
        small_ctx.uc_stack.ss_sp = stack;
        small_ctx.uc_stack.ss_size = size;
        small_ctx.uc_link = &main_ctx;
        makecontext(&small_ctx, on_small_stack, 0);
        swapcontext(&main_ctx, &small_ctx);
    } else {
        stack_t ss = {.ss_sp = stack, .ss_size = size, .ss_flags = 0};
        if (sigaltstack(&ss, NULL) != 0) {
            perror("sigaltstack");
            _exit(4);
        }
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_usr1;
        sa.sa_flags = SA_ONSTACK;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGUSR1, &sa, NULL);
        syscall(SYS_tgkill, getpid(), gettid(), SIGUSR1);
    }
    _exit(3);
}

int main(int argc, char **argv)
{
    if (argc != 3 || (strcmp(argv[1], "stack") != 0 && strcmp(argv[1], "altstack") != 0)) {
        fprintf(stderr, "usage: p_sigstack stack|altstack SIZE\n");
        return 2;
    }
    size = (size_t)strtoul(argv[2], NULL, 0);
    size_t pagesz = (size_t)sysconf(_SC_PAGESIZE), total = (GUARD + size + pagesz - 1) / pagesz * pagesz;
    char *m = mmap(NULL, total + pagesz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    sh = (struct shared *)(m + total);
    region = m + total - GUARD - size; /* the stack ends where the region does */
    memset(m, PATTERN, total);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0)
        child(argv[1]);
    int status = 0;
    waitpid(pid, &status, 0);
    char *stack = region + GUARD, *top = stack + size;
    char *low = m;
    while (low < top && (unsigned char)*low == PATTERN)
        low++;
    size_t used = (size_t)(top - low);
    bool overflow = low < stack;
    printf("%s %zu: used %zu bytes", argv[1], size, used);
    if (sh->handler_sp)
        printf(", %zu below the SIGUSR1 handler", (size_t)(sh->handler_sp - (uintptr_t)low));
    printf("; guard %s; child %s %d\n", overflow ? "TOUCHED" : "untouched",
           WIFSIGNALED(status) ? "killed by signal" : "exited", WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    fflush(stdout);
    _exit(!overflow && WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM ? 0 : 1);
}
