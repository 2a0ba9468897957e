/* churn.c - small-object churn: the many short- and long-lived small
 * allocations of an interpreter or a framework's bookkeeping.
 *
 * Each thread keeps a table of live blocks and, per operation, frees a
 * randomly chosen one and puts a new block of random size (16 B - 4 KiB,
 * log-uniform) in its place, so lifetimes are random and geometric.
 * LIVE (default 16384, about 12 MB a thread) is the table's size: with
 * 1024 (under 1 MB) the blocks stay in the core's caches, and the time is
 * the allocator's own instructions more than the memory's stalls.
 *
 * usage: churn THREADS OPS_PER_THREAD [LIVE] */
#include <pthread.h>

#include "bench.h"

#define SLOTS 16384     /* live blocks per thread (~12 MB at these sizes), by default */
#define SIZE_LO_LOG2 4  /* 16 B */
#define SIZE_HI_LOG2 12 /* sizes below 4 KiB */
#define MAX_THREADS 64

struct worker {
    pthread_t tid;
    uint64_t seed;
    long ops;
    size_t live;
};

static void *churn(void *arg)
{
    struct worker *w = arg;
    uint64_t rng = w->seed;
    void **slot = calloc(w->live, sizeof *slot);
    if (!slot)
        abort();

    for (long i = 0; i < w->ops; i++) {
        size_t k = bench_rand(&rng) % w->live;
        size_t n = bench_size(&rng, SIZE_LO_LOG2, SIZE_HI_LOG2);
        free(slot[k]);
        char *p = malloc(n);
        if (!p)
            abort();
        p[0] = (char)i; /* touch both ends, as a real user would */
        p[n - 1] = (char)i;
        slot[k] = p;
    }
    for (size_t k = 0; k < w->live; k++)
        free(slot[k]);
    free(slot);
    return NULL;
}

int main(int argc, char **argv)
{
    const char *usage = "THREADS OPS_PER_THREAD [LIVE]";
    long threads = bench_arg(argc, argv, 1, usage);
    long ops = bench_arg(argc, argv, 2, usage);
    long live = argc > 3 ? bench_arg(argc, argv, 3, usage) : SLOTS;
    struct worker w[MAX_THREADS];
    if (threads > MAX_THREADS) {
        fprintf(stderr, "churn: at most %d threads\n", MAX_THREADS);
        return 2;
    }

    double t0 = bench_now();
    for (long t = 0; t < threads; t++) {
        w[t] = (struct worker){.seed = BENCH_SEED + (uint64_t)t, .ops = ops, .live = (size_t)live};
        if (pthread_create(&w[t].tid, NULL, churn, &w[t]))
            abort();
    }
    for (long t = 0; t < threads; t++)
        pthread_join(w[t].tid, NULL);
    double secs = bench_now() - t0;

    printf("{\"threads\": %ld, \"ops\": %ld, \"ops_per_s\": %.0f}\n", threads, threads * ops,
           (double)(threads * ops) / secs);
    return 0;
}
