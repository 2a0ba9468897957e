/* fork_loop.c - a program that forks per task: each iteration builds a
 * working set of 4 MiB blocks (a batch, a request's buffers), touches every
 * page, frees it, then forks a worker that exits at once and waits for it.
 * Every page written on the next iteration faults: write-protected by the
 * fork where the allocator kept its free memory, a fresh zero page where it
 * gave it back before the fork (fault_cost.c times both kinds).
 *
 * usage: fork_loop ITERATIONS MIB */
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
        bench_fork_wait();
    }
    double secs = bench_now() - t0;
    printf("{\"ops\": %ld, \"ms_per_iter\": %.4f, \"rss_after_unload\": %lld}\n", iterations,
           secs * 1e3 / (double)iterations, bench_rss_bytes());
    free(b);
    return 0;
}
