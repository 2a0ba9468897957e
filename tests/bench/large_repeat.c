/* large_repeat.c - repeated large allocations: activation and staging
 * buffers of 1-64 MiB that a framework allocates, fills and frees again on
 * every step.  An allocator that returns every large free to the OS pays
 * the page faults again on each iteration.
 *
 * Sizes are log-uniform in [1 MiB, 64 MiB) from a fixed seed; every page of
 * each block is written before it is freed.
 *
 * usage: large_repeat ITERATIONS */
#include "bench.h"

#define SIZE_LO_LOG2 20 /* 1 MiB */
#define SIZE_HI_LOG2 26 /* sizes below 64 MiB */
#define PAGE 4096

int main(int argc, char **argv)
{
    long iterations = bench_arg(argc, argv, 1, "ITERATIONS");
    uint64_t rng = BENCH_SEED;
    unsigned long long touched = 0;

    double t0 = bench_now();
    for (long i = 0; i < iterations; i++) {
        size_t n = bench_size(&rng, SIZE_LO_LOG2, SIZE_HI_LOG2);
        char *p = malloc(n);
        if (!p)
            abort();
        for (size_t off = 0; off < n; off += PAGE)
            p[off] = (char)i;
        bench_escape(p);
        free(p);
        touched += n;
    }
    double secs = bench_now() - t0;

    printf("{\"ops\": %ld, \"bytes_touched\": %llu, \"ms_per_iter\": %.4f, "
           "\"rss_after_unload\": %lld}\n",
           iterations, touched, secs * 1e3 / (double)iterations, bench_rss_bytes());
    return 0;
}
