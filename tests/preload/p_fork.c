/* p_fork.c - children that fork() does not make, and a forked child that
 * makes no allocator call.  Children write with write(2), never stdio.
 *
 *   p_fork vfork-exit S   a vfork child calls exit() instead of _exit();
 *                         then the parent frees 800 MB (200 x 4 MB) and
 *                         sleeps S seconds without an allocator call:
 *                         "rss_after_free_mb N" and "rss_end_mb N"; it
 *                         ends with _exit(0)
 *   p_fork nohandlers KIND S DIR  KIND is _Fork, rawfork (the fork system
 *                         call) or clone (the clone system call without
 *                         CLONE_VM), none of which runs fork handlers.  The
 *                         parent makes 5000 small allocations, frees 800 MB
 *                         and waits until it got them back (its background
 *                         thread then holds a lock of tcmalloc's only for
 *                         microseconds now and then); then the child frees
 *                         800 MB of its own and sleeps S seconds without an
 *                         allocator call: "child rss_end_mb N" and
 *                         "child_file 0|1" (whether its stats file
 *                         DIR/PID.json exists by then); it ends with
 *                         exit(0)
 *   p_fork nohandlers-small KIND S DIR  the same fork; the child makes 100
 *                         small allocations (no large one), then sleeps S
 *                         seconds without an allocator call: "child_file
 *                         0|1" as above
 *   p_fork idle S DIR     fork(); the child makes no allocator call and
 *                         sleeps S seconds: "child_file 0|1" as above; it
 *                         ends with _exit(0) */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MB (1024 * 1024)

static void say(const char *fmt, long a, long b)
{
    char line[200];
    int n = snprintf(line, sizeof line, fmt, a, b);
    if (n > 0 && write(1, line, (size_t)n) < 0)
        _exit(9);
}

/* Resident MB from /proc/self/statm, without stdio (no allocation). */
static long rss_mb(void)
{
    char buf[128];
    int fd = open("/proc/self/statm", O_RDONLY);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    char *p = strchr(buf, ' ');
    return p ? strtol(p + 1, NULL, 10) * sysconf(_SC_PAGESIZE) / MB : -1;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* 200 x 4 MB allocated, every page written, all freed. */
static void burst(void)
{
    enum { N = 200 };
    static char *b[N];
    for (int i = 0; i < N; i++) {
        b[i] = malloc(4 * MB);
        memset(b[i], 1, 4 * MB);
    }
    for (int i = 0; i < N; i++)
        free(b[i]);
}

/* Whether this process's stats file exists in dir. */
static int own_file(const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%d.json", dir, (int)getpid());
    return access(path, F_OK) == 0;
}

static int wait_for(pid_t pid)
{
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid)
        return 2;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 3;
}

static int vfork_exit(long settle_ms)
{
    pid_t pid = vfork();
    if (pid == 0)
        exit(0); /* should be _exit: runs the exit handlers in the parent's memory */
    if (wait_for(pid) != 0)
        return 1;
    burst();
    say("rss_after_free_mb %ld\n", rss_mb(), 0);
    sleep_ms(settle_ms);
    say("rss_end_mb %ld\n", rss_mb(), 0);
    _exit(0);
}

static pid_t fork_without_handlers(const char *kind)
{
    if (strcmp(kind, "_Fork") == 0)
        return _Fork();
    if (strcmp(kind, "rawfork") == 0)
        return (pid_t)syscall(SYS_fork);
    if (strcmp(kind, "clone") == 0)
        return (pid_t)syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
    return -1;
}

static int no_handlers(const char *kind, long settle_ms, const char *dir)
{
    for (int i = 0; i < 5000; i++)
        free(malloc(100));
    long start = rss_mb();
    burst();
    for (int i = 0; i < 200 && rss_mb() > start + 64; i++)
        sleep_ms(50); /* the parent's own return, before the fork */
    /* ... and then some: the parent's background thread runs (no fork
     * handler stops it), and a child of a fork without handlers that
     * allocates while it held one of tcmalloc's locks would wait for it
     * for ever.  Its ticks from now on are short. */
    sleep_ms(500);
    pid_t pid = fork_without_handlers(kind);
    if (pid == 0) {
        burst();
        sleep_ms(settle_ms);
        say("child rss_end_mb %ld\nchild_file %ld\n", rss_mb(), own_file(dir));
        exit(0);
    }
    return wait_for(pid);
}

static int no_handlers_small(const char *kind, long settle_ms, const char *dir)
{
    static void *volatile sink;
    pid_t pid = fork_without_handlers(kind);
    if (pid == 0) {
        for (int i = 0; i < 100; i++) {
            sink = malloc(64);
            free(sink);
        }
        sleep_ms(settle_ms);
        say("child_file %ld\n", own_file(dir), 0);
        exit(0);
    }
    return wait_for(pid);
}

static int idle_child(long settle_ms, const char *dir)
{
    pid_t pid = fork();
    if (pid == 0) {
        sleep_ms(settle_ms);
        say("child_file %ld\n", own_file(dir), 0);
        _exit(0);
    }
    return wait_for(pid);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "vfork-exit") == 0 && argc == 3)
        return vfork_exit((long)(atof(argv[2]) * 1000));
    if (strcmp(mode, "nohandlers") == 0 && argc == 5)
        return no_handlers(argv[2], (long)(atof(argv[3]) * 1000), argv[4]);
    if (strcmp(mode, "nohandlers-small") == 0 && argc == 5)
        return no_handlers_small(argv[2], (long)(atof(argv[3]) * 1000), argv[4]);
    if (strcmp(mode, "idle") == 0 && argc == 4)
        return idle_child((long)(atof(argv[2]) * 1000), argv[3]);
    fprintf(stderr, "usage: p_fork vfork-exit S | nohandlers[-small] _Fork|rawfork|clone S DIR | idle S DIR\n");
    return 2;
}
