/* p_signal.c - what a program sees of its signal dispositions.  Each mode
 * prints a transcript that must be the same with and without the shim.
 *
 *   p_signal queries      every libc way to set or query a disposition, on
 *                         SIGTERM, SIGINT and SIGUSR1, with errno after each
 *   p_signal resethand    a SA_RESETHAND handler runs once, then SIGTERM kills
 *   p_signal sysv         the same through sysv_signal
 *   p_signal threads      threads set and query SIGTERM and SIGINT at once
 *                         while SIGINT keeps arriving; then SIGTERM kills
 *   p_signal fork         a child inherits the dispositions; after exec,
 *                         handlers are SIG_DFL and SIG_IGN stays
 *   p_signal _Fork | rawfork  the same for a child of _Fork or of the raw
 *                         fork system call, which run no fork handlers;
 *                         its own settings, then SIGTERM kills it
 *   p_signal exit-in-handler USEC  a timer's handler calls exit(3) after
 *                         USEC microseconds, wherever it finds the main
 *                         loop of large mallocs and frees
 *   p_signal vfork-oneshot  a SA_RESETHAND handler runs in a vfork child;
 *                         the parent's stays set
 *   p_signal pid1         as PID 1 of a pid namespace: SIG_DFL signals are
 *                         ignored, and interrupt nothing
 *   p_signal blocked-exit  SIGUSR1 blocked with no handler (as for sigwait),
 *                         200 MiB kept in 50 blocks, one line to a fully
 *                         buffered stdout, then a plain return from main */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

/* glibc exports these without declaring them (bsd_signal: not with
 * _GNU_SOURCE); the old calls are deprecated, and testing them is the point. */
extern int __sigaction(int, const struct sigaction *, struct sigaction *);
extern sighandler_t __sysv_signal(int, sighandler_t);
extern sighandler_t bsd_signal(int, sighandler_t);
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

static volatile sig_atomic_t hits;
static void h1(int sig) { (void)sig, hits++; }
static void h2(int sig, siginfo_t *info, void *ctx) { (void)sig, (void)info, (void)ctx, hits++; }
static void *restorer; /* glibc's, as the kernel reports it for a handler set on SIGUSR2 */

static const char *name(void *h)
{
    if (h == (void *)SIG_DFL) return "DFL";
    if (h == (void *)SIG_IGN) return "IGN";
    if (h == (void *)SIG_ERR) return "ERR";
    if (h == (void *)SIG_HOLD) return "HOLD";
    if (h == (void *)h1) return "h1";
    if (h == (void *)h2) return "h2";
    return "other";
}

static void show_action(const char *what, int sig, const struct sigaction *sa)
{
    unsigned long long mask = 0;
    for (int s = 1; s <= 64; s++)
        if (sigismember(&sa->sa_mask, s) == 1)
            mask |= 1ULL << (s - 1);
    printf("%-26s %2d: handler=%s flags=%#x mask=%#llx restorer=%s\n", what, sig, name((void *)sa->sa_handler),
           (unsigned)sa->sa_flags, mask,
           sa->sa_restorer == NULL ? "null" : sa->sa_restorer == restorer ? "glibc" : "other");
}

static void query(const char *what, int sig)
{
    struct sigaction sa;
    memset(&sa, 0x5a, sizeof sa);
    errno = 77;
    int rc = sigaction(sig, NULL, &sa);
    printf("%-26s %2d: rc=%d errno=%d\n", "query", sig, rc, errno);
    show_action(what, sig, &sa);
}

#define CALL_H(expr, sig)                                                                                        \
    do {                                                                                                         \
        errno = 77;                                                                                              \
        sighandler_t r_ = (expr);                                                                                \
        printf("%-26s %2d: returned %s errno=%d\n", #expr, sig, name((void *)r_), errno);                       \
    } while (0)
#define CALL_I(expr, sig)                                                                                        \
    do {                                                                                                         \
        errno = 77;                                                                                              \
        int r_ = (expr);                                                                                         \
        printf("%-26s %2d: returned %d errno=%d\n", #expr, sig, r_, errno);                                     \
    } while (0)

static void learn_restorer(void)
{
    struct sigaction sa, got;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = h1;
    sigaction(SIGUSR2, &sa, NULL);
    sigaction(SIGUSR2, NULL, &got);
    restorer = (void *)got.sa_restorer;
    signal(SIGUSR2, SIG_DFL);
}

static void queries_on(int sig)
{
    struct sigaction sa, old;
    query("start", sig);
    CALL_H(signal(sig, h1), sig);
    query("after signal(h1)", sig);

    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = h2;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGUSR2);
    sigaddset(&sa.sa_mask, SIGKILL); /* the kernel drops it */
    memset(&old, 0x5a, sizeof old);
    CALL_I(sigaction(sig, &sa, &old), sig);
    show_action("old from sigaction(h2)", sig, &old);
    query("after sigaction(h2)", sig);

    CALL_I(siginterrupt(sig, 1), sig);
    query("after siginterrupt 1", sig);
    CALL_H(signal(sig, h1), sig);
    query("signal(h1), interrupting", sig);
    CALL_I(siginterrupt(sig, 0), sig);
    query("after siginterrupt 0", sig);

    CALL_I(sigignore(sig), sig);
    query("after sigignore", sig);
    CALL_H(sigset(sig, h1), sig);
    query("after sigset(h1)", sig);
    CALL_H(sigset(sig, SIG_HOLD), sig);
    sigset_t blocked;
    sigprocmask(SIG_BLOCK, NULL, &blocked);
    printf("%-26s %2d: %d\n", "blocked after SIG_HOLD", sig, sigismember(&blocked, sig));
    CALL_H(sigset(sig, SIG_HOLD), sig);
    CALL_H(sigset(sig, SIG_DFL), sig);
    sigprocmask(SIG_BLOCK, NULL, &blocked);
    printf("%-26s %2d: %d\n", "blocked after sigset(DFL)", sig, sigismember(&blocked, sig));
    query("after sigset(DFL)", sig);

    CALL_H(sysv_signal(sig, h1), sig);
    query("after sysv_signal(h1)", sig);
    CALL_H(__sysv_signal(sig, SIG_IGN), sig);
    CALL_H(bsd_signal(sig, h1), sig);
    CALL_H(ssignal(sig, SIG_IGN), sig);
    CALL_H(signal(sig, SIG_ERR), sig);
    CALL_H(sysv_signal(sig, SIG_ERR), sig);

    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sa.sa_flags = SA_RESETHAND | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGHUP);
    memset(&old, 0x5a, sizeof old);
    CALL_I(__sigaction(sig, &sa, &old), sig);
    show_action("old from __sigaction(DFL)", sig, &old);
    query("after __sigaction(DFL)", sig);

    /* Setting back what a query returned (SA_RESTORER included). */
    sigaction(sig, NULL, &old);
    CALL_I(sigaction(sig, &old, NULL), sig);
    query("after setting it back", sig);
    CALL_H(signal(sig, SIG_DFL), sig);
    query("end", sig);
}

static int queries(void)
{
    learn_restorer();
    int sigs[] = {SIGTERM, SIGINT, SIGUSR1};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        queries_on(sigs[i]);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = h1;
    CALL_I(sigaction(0, &sa, NULL), 0);
    CALL_I(sigaction(65, NULL, &sa), 65);
    CALL_I(sigaction(SIGKILL, &sa, NULL), SIGKILL);
    CALL_H(signal(SIGSTOP, h1), SIGSTOP);
    CALL_I(sigaction(SIGTERM, NULL, NULL), SIGTERM);
    return 0;
}

/* A one-shot handler runs once; the disposition is then SIG_DFL with the
 * flags kept, and the next SIGTERM kills. */
static int resethand(int sysv)
{
    learn_restorer();
    if (sysv) {
        CALL_H(sysv_signal(SIGTERM, h1), SIGTERM);
    } else {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = h1;
        sa.sa_flags = SA_RESETHAND | SA_RESTART;
        sigemptyset(&sa.sa_mask);
        CALL_I(sigaction(SIGTERM, &sa, NULL), SIGTERM);
    }
    query("before raise", SIGTERM);
    raise(SIGTERM);
    printf("handler ran %d times\n", (int)hits);
    query("after raise", SIGTERM);
    fflush(stdout);
    raise(SIGTERM);
    printf("still alive\n");
    return 1;
}

static volatile int stop;
static int bad;

static void *toggle(void *arg)
{
    int sig = (int)(long)arg;
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    for (int i = 0; !stop; i++) {
        /* SIGINT keeps arriving: it must never be SIG_DFL here. */
        sa.sa_handler = i % 2 ? h1 : sig == SIGINT ? SIG_IGN : SIG_DFL;
        if (sigaction(sig, &sa, &old) != 0)
            __atomic_add_fetch(&bad, 1, __ATOMIC_RELAXED);
        if (old.sa_handler != h1 && old.sa_handler != SIG_IGN && old.sa_handler != SIG_DFL)
            __atomic_add_fetch(&bad, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

static int threads(void)
{
    learn_restorer();
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_IGN;
    sigaction(SIGINT, &sa, NULL);
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, toggle, (void *)(long)(i % 2 ? SIGINT : SIGTERM));
    for (int i = 0; i < 2000; i++) {
        kill(getpid(), SIGINT);
        if (i % 50 == 0)
            usleep(1000);
    }
    stop = 1;
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    printf("inconsistent answers: %d\n", bad);
    signal(SIGTERM, SIG_DFL);
    query("after the threads", SIGTERM);
    fflush(stdout);
    kill(getpid(), SIGTERM);
    sleep(10);
    printf("still alive\n");
    return 1;
}

static int fork_exec(const char *self)
{
    learn_restorer();
    signal(SIGINT, h1);
    signal(SIGTERM, SIG_IGN);
    pid_t pid = fork();
    if (pid == 0) {
        query("child SIGINT", SIGINT);
        query("child SIGTERM", SIGTERM);
        fflush(stdout);
        execl("/proc/self/exe", self, "after-exec", (char *)NULL);
        _exit(127);
    }
    int status;
    waitpid(pid, &status, 0);
    printf("child status %d\n", status);
    return 0;
}

/* Wait for child pid and print how it ended. */
static void print_end(const char *who, pid_t pid);

static void exit_now(int sig) { (void)sig, exit(3); }

/* Not async-signal-safe, but common in C programs: the exit dump must not
 * wait for a tcmalloc lock that the interrupted malloc or free holds. */
static __attribute__((noreturn)) int exit_in_handler(long usec)
{
    signal(SIGALRM, exit_now);
    struct itimerval it = {{0, 0}, {usec / 1000000, usec % 1000000}};
    setitimer(ITIMER_REAL, &it, NULL);
    static void *v[256];
    unsigned long x = 88172645463325252ul;
    for (;;) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        unsigned k = x % 256;
        free(v[k]);
        v[k] = malloc(40000 + x % 900000);
    }
}

/* A child made without fork handlers (glibc's _Fork, or the system call
 * itself, as some runtimes do) owns its dispositions as a forked one does. */
static int fork_without_handlers(int raw)
{
    learn_restorer();
    signal(SIGINT, h1);
    signal(SIGTERM, SIG_IGN);
    pid_t pid = raw ? (pid_t)syscall(SYS_fork) : _Fork();
    if (pid == 0) {
        query("child SIGINT", SIGINT);
        signal(SIGINT, SIG_IGN);
        query("child SIGINT after SIG_IGN", SIGINT);
        signal(SIGTERM, SIG_DFL);
        query("child SIGTERM after SIG_DFL", SIGTERM);
        raise(SIGTERM);
        _exit(3);
    }
    print_end("child", pid);
    query("parent SIGINT", SIGINT);
    query("parent SIGTERM", SIGTERM);
    return 0;
}

static void print_end(const char *who, pid_t pid)
{
    int status;
    waitpid(pid, &status, 0);
    printf("%s: %s %d\n", who, WIFSIGNALED(status) ? "signal" : "exit",
           WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
}

/* A vfork child (posix_spawn, CPython's subprocess) runs in the parent's
 * memory until it execs, and resets dispositions first: the parent's stay
 * as they were.  A SIGTERM that reaches such a child kills it as SIG_DFL
 * does; the parent's own SIGTERM then still kills it (with the dump). */
static int vfork_child(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = h1;
    sigaction(SIGINT, &sa, NULL);
    pid_t pid = vfork();
    if (pid == 0) {
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_IGN);
        siginterrupt(SIGUSR1, 1);
        _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    query("parent SIGINT after vfork", SIGINT);
    query("parent SIGTERM after vfork", SIGTERM);
    query("parent SIGUSR1 after vfork", SIGUSR1);
    pid = vfork();
    if (pid == 0) {
        raise(SIGTERM);
        _exit(0);
    }
    print_end("vfork child", pid);
    raise(SIGTERM);
    printf("still alive after SIGTERM\n");
    return 0;
}

/* A one-shot handler runs in a vfork child (before its exec): the
 * parent's handler stays set, and runs once for it too. */
static int vfork_oneshot(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = h1;
    sa.sa_flags = SA_RESETHAND;
    sigaction(SIGTERM, &sa, NULL);
    pid_t pid = vfork();
    if (pid == 0) {
        kill(getpid(), SIGTERM);
        _exit(hits == 1 ? 0 : 1);
    }
    int status;
    waitpid(pid, &status, 0);
    printf("vfork child ran the handler: %s\n", WIFEXITED(status) && WEXITSTATUS(status) == 0 ? "yes" : "no");
    hits = 0;
    query("parent SIGTERM after the child's delivery", SIGTERM);
    raise(SIGTERM);
    printf("parent: hits %d, alive\n", (int)hits);
    query("parent SIGTERM after its own delivery", SIGTERM);
    return 0;
}

/* Run as the first process of a pid namespace (a container's PID 1): the
 * kernel ignores a signal whose disposition is SIG_DFL, so another
 * process's SIGTERM interrupts nothing; a one-shot handler runs once and
 * the next SIGINT is ignored too.  A forked child (not PID 1) still dies of
 * SIGTERM. */
static int pid1(void)
{
    if (getpid() != 1) {
        fprintf(stderr, "p_signal pid1: run me as PID 1 (unshare --pid --fork)\n");
        return 2;
    }
    pid_t pid = fork();
    if (pid == 0) {
        usleep(50000);
        kill(1, SIGTERM);
        _exit(0);
    }
    errno = 0;
    int r = poll(NULL, 0, 400);
    printf("poll across SIGTERM: %d %s\n", r, r ? strerror(errno) : "");
    int status;
    waitpid(pid, &status, 0);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = h1;
    sa.sa_flags = SA_RESETHAND;
    sigaction(SIGINT, &sa, NULL);
    raise(SIGINT);
    query("SIGINT after one-shot", SIGINT);
    raise(SIGINT);
    printf("hits %d, alive after a second SIGINT\n", (int)hits);
    pid = fork();
    if (pid == 0) {
        raise(SIGTERM);
        _exit(0);
    }
    print_end("child", pid);
    return 0;
}

static int blocked_exit(void)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    static void *keep[50];
    for (int i = 0; i < 50; i++)
        if (!(keep[i] = malloc(4 << 20)))
            return 1;
    setvbuf(stdout, NULL, _IOFBF, 0);
    printf("program output line\n");
    return 0;
}

static int after_exec(void)
{
    learn_restorer();
    query("after exec SIGINT", SIGINT);
    query("after exec SIGTERM", SIGTERM);
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "queries") == 0)
        return queries();
    if (strcmp(mode, "resethand") == 0)
        return resethand(0);
    if (strcmp(mode, "sysv") == 0)
        return resethand(1);
    if (strcmp(mode, "threads") == 0)
        return threads();
    if (strcmp(mode, "fork") == 0)
        return fork_exec(argv[0]);
    if (strcmp(mode, "after-exec") == 0)
        return after_exec();
    if (strcmp(mode, "_Fork") == 0 || strcmp(mode, "rawfork") == 0)
        return fork_without_handlers(mode[0] == 'r');
    if (strcmp(mode, "vfork") == 0)
        return vfork_child();
    if (strcmp(mode, "exit-in-handler") == 0 && argc > 2)
        return exit_in_handler(atol(argv[2]));
    if (strcmp(mode, "pid1") == 0)
        return pid1();
    if (strcmp(mode, "vfork-oneshot") == 0)
        return vfork_oneshot();
    if (strcmp(mode, "blocked-exit") == 0)
        return blocked_exit();
    fprintf(stderr, "usage: p_signal queries|resethand|sysv|threads|fork|_Fork|rawfork|vfork|vfork-oneshot|pid1|blocked-exit|exit-in-handler USEC\n");
    return 2;
}
