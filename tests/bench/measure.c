/* measure.c - run one workload and measure it, like a minimal time(1).
 *
 * Not a workload: the runner starts each run through this small process so
 * that the child's peak RSS is its own.  (A child forked or vforked from the
 * Python runner starts with the runner's memory counted in its ru_maxrss,
 * which survives exec.)  LD_PRELOAD is set only in the child, so this process
 * runs on glibc under every allocator.
 *
 * Writes one JSON object to RESULT_FILE: raw wait status, timed_out, wall_s,
 * user_s, sys_s (child plus the children it waited for) and maxrss_kb.
 *
 * usage: measure RESULT_FILE TIMEOUT_S PRELOAD PROGRAM [ARG...]
 *        (PRELOAD "" = run without LD_PRELOAD) */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile pid_t child;
static volatile sig_atomic_t timed_out;

static void on_alarm(int sig)
{
    (void)sig;
    timed_out = 1;
    kill(child, SIGKILL); /* not yet reaped: the pid is still ours */
}

static double seconds(struct timeval tv)
{
    return (double)tv.tv_sec + (double)tv.tv_usec * 1e-6;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: %s RESULT_FILE TIMEOUT_S PRELOAD PROGRAM [ARG...]\n", argv[0]);
        return 2;
    }
    const char *result_file = argv[1];
    unsigned timeout = (unsigned)strtoul(argv[2], NULL, 10);
    const char *preload = argv[3];

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    child = fork();
    if (child < 0) {
        perror("measure: fork");
        return 1;
    }
    if (child == 0) {
        if (*preload && setenv("LD_PRELOAD", preload, 1))
            _exit(127);
        execv(argv[4], &argv[4]);
        fprintf(stderr, "measure: cannot run %s: %s\n", argv[4], strerror(errno));
        _exit(127);
    }

    struct sigaction sa = {.sa_handler = on_alarm};
    sigaction(SIGALRM, &sa, NULL);
    alarm(timeout);
    int status;
    struct rusage ru;
    while (wait4(child, &status, 0, &ru) < 0) {
        if (errno != EINTR) {
            perror("measure: wait4");
            return 1;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    alarm(0);

    FILE *f = fopen(result_file, "w");
    if (!f) {
        perror(result_file);
        return 1;
    }
    fprintf(f,
            "{\"status\": %d, \"timed_out\": %s, \"wall_s\": %.6f, \"user_s\": %.6f, \"sys_s\": %.6f, "
            "\"maxrss_kb\": %ld}\n",
            status, timed_out ? "true" : "false",
            (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9, seconds(ru.ru_utime),
            seconds(ru.ru_stime), ru.ru_maxrss);
    return fclose(f) ? 1 : 0;
}
