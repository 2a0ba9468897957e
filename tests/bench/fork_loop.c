/* fork_loop.c - a program that forks per task: each iteration builds a
 * working set of 4 MiB blocks (a batch, a request's buffers), touches every
 * page, frees it, then forks a worker that exits at once and waits for it.
 * An allocator that gives free memory back at every fork faults the
 * working set in again on the next iteration.
 *
 * usage: fork_loop ITERATIONS MIB */
#include <sys/wait.h>

#include "bench.h"

#define BLOCK (4u << 20)
#define PAGE 4096

int main(int argc, char **argv)
{
    long iterations = bench_arg(argc, argv, 1, "ITERATIONS");
    long mib = bench_arg(argc, argv, 2, "MIB");
    size_t blocks = (size_t)mib / 4;
    char **b = calloc(blocks, sizeof *b);
    if (!b)
        abort();
    double t0 = bench_now();
    for (long i = 0; i < iterations; i++) {
        for (size_t k = 0; k < blocks; k++) {
            b[k] = malloc(BLOCK);
            if (!b[k])
                abort();
            for (size_t off = 0; off < BLOCK; off += PAGE)
                b[k][off] = (char)i;
            bench_escape(b[k]);
        }
        for (size_t k = 0; k < blocks; k++)
            free(b[k]);
        pid_t pid = fork();
        if (pid < 0)
            abort();
        if (pid == 0)
            _exit(0);
        int status;
        if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
            abort();
    }
    double secs = bench_now() - t0;
    printf("{\"ops\": %ld, \"ms_per_iter\": %.4f, \"rss_after_unload\": %lld}\n", iterations,
           secs * 1e3 / (double)iterations, bench_rss_bytes());
    free(b);
    return 0;
}
