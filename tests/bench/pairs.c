/* pairs.c - malloc+free pairs for counting instructions (instructions.sh).
 *
 * PAIRS times: a size drawn log-uniformly from [LO, HI] bytes, malloc, one
 * byte written at the start of the block, free.  The loop is its own
 * function (run_pairs, never inlined) so that callgrind's --toggle-collect
 * counts it alone, without start-up or other threads.  With "noalloc" as the
 * fourth argument the loop does the same except the malloc and the free (it
 * writes a static byte instead): the loop's own instructions, to subtract.
 *
 * usage: pairs PAIRS LO HI [noalloc] */
#include "bench.h"

#include <string.h>

static char scratch;

/* Log-uniform in [lo, hi]: sizes as common per power of two. */
static size_t pick(uint64_t *rng, size_t lo, size_t hi)
{
    unsigned lo_log2 = 0, hi_log2 = 0;
    while (((size_t)2 << lo_log2) <= lo)
        lo_log2++;
    while (((size_t)1 << hi_log2) <= hi)
        hi_log2++;
    for (;;) {
        size_t n = bench_size(rng, lo_log2, hi_log2);
        if (n >= lo && n <= hi)
            return n;
    }
}

__attribute__((noinline)) static long run_pairs(long pairs, size_t lo, size_t hi, int alloc)
{
    uint64_t rng = BENCH_SEED;
    long sum = 0;
    for (long i = 0; i < pairs; i++) {
        size_t n = pick(&rng, lo, hi);
        char *p = alloc ? malloc(n) : &scratch;
        if (!p)
            abort();
        p[0] = (char)i;
        bench_escape(p);
        sum += p[0];
        if (alloc)
            free(p);
    }
    return sum;
}

int main(int argc, char **argv)
{
    const char *usage = "PAIRS LO HI [noalloc]";
    long pairs = bench_arg(argc, argv, 1, usage);
    long lo = bench_arg(argc, argv, 2, usage);
    long hi = bench_arg(argc, argv, 3, usage);
    int alloc = !(argc > 4 && strcmp(argv[4], "noalloc") == 0);
    if (hi < lo) {
        fprintf(stderr, "usage: %s %s (LO <= HI)\n", argv[0], usage);
        return 2;
    }
    long sum = run_pairs(pairs, (size_t)lo, (size_t)hi, alloc);
    printf("{\"pairs\": %ld, \"lo\": %ld, \"hi\": %ld, \"alloc\": %d, \"sum\": %ld}\n", pairs, lo, hi, alloc, sum);
    return 0;
}
