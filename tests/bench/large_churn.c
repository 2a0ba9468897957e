/* large_churn.c - a working set of large blocks that keeps changing: LIVE
 * blocks of 1 MiB to MAX_MIB (log-uniform), one freed and re-allocated per
 * step at random, every page written.  The memory freed is needed again a
 * moment later, so an allocator that returns it to the OS pays the page
 * faults over and over.
 *
 * usage: large_churn STEPS LIVE MAX_MIB */
#include "bench.h"

#define PAGE 4096

int main(int argc, char **argv)
{
    long steps = bench_arg(argc, argv, 1, "STEPS LIVE MAX_MIB");
    long live = bench_arg(argc, argv, 2, "STEPS LIVE MAX_MIB");
    long max_mib = bench_arg(argc, argv, 3, "STEPS LIVE MAX_MIB");
    unsigned hi = 21; /* sizes below 2^hi bytes */
    while (((long)1 << (hi - 20)) < max_mib)
        hi++;
    char **block = calloc((size_t)live, sizeof *block);
    if (!block)
        abort();
    uint64_t rng = BENCH_SEED;
    unsigned long long touched = 0;
    double t0 = bench_now();
    for (long i = 0; i < steps + live; i++) {
        long slot = i < live ? i : (long)(bench_rand(&rng) % (uint64_t)live);
        size_t n = bench_size(&rng, 20, hi);
        free(block[slot]);
        block[slot] = malloc(n);
        if (!block[slot])
            abort();
        for (size_t off = 0; off < n; off += PAGE)
            block[slot][off] = (char)i;
        touched += n;
    }
    double secs = bench_now() - t0;
    long long rss = bench_rss_bytes();
    for (long i = 0; i < live; i++)
        free(block[i]);
    free(block);
    printf("{\"ops\": %ld, \"bytes_touched\": %llu, \"ms_per_step\": %.4f, \"rss_live\": %lld}\n", steps, touched,
           secs * 1e3 / (double)(steps + live), rss);
    return 0;
}
