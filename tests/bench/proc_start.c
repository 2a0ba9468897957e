/* proc_start.c - process start cost: a preloaded allocator is inherited by
 * every child a WebUI runs (git, pip, ffmpeg, shell helpers), and each one
 * pays for loading and initialising it.
 *
 * fork()s and exec()s /bin/true STARTS times, one after the other, with the
 * environment (LD_PRELOAD included) it was given, and reports the median and
 * mean time per start.
 *
 * usage: proc_start STARTS */
#include <sys/wait.h>

#include "bench.h"

#define CHILD "/bin/true"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    long starts = bench_arg(argc, argv, 1, "STARTS");
    double *secs = malloc((size_t)starts * sizeof *secs);
    double total = 0;
    if (!secs)
        abort();

    for (long i = 0; i < starts; i++) {
        double t0 = bench_now();
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            return 1;
        }
        if (pid == 0) {
            execl(CHILD, CHILD, (char *)NULL);
            _exit(127);
        }
        int status = 0;
        if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status)) {
            fprintf(stderr, "proc_start: %s failed (status %#x)\n", CHILD, status);
            return 1;
        }
        secs[i] = bench_now() - t0;
        total += secs[i];
    }
    qsort(secs, (size_t)starts, sizeof *secs, cmp_double);

    printf("{\"ops\": %ld, \"per_start_us_median\": %.1f, \"per_start_us_mean\": %.1f}\n", starts,
           secs[starts / 2] * 1e6, total / (double)starts * 1e6);
    free(secs);
    return 0;
}
