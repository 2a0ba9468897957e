/* large_churn.c - a working set of large blocks that keeps changing: LIVE
 * blocks of 1 MiB to MAX_MIB (log-uniform), one freed and re-allocated per
 * step at random, every page written.  The memory freed is needed again a
 * moment later, so an allocator that returns it to the OS pays the page
 * faults over and over.
 *
 * With THREADS > 1 the steps are shared out among that many threads working
 * on the same LIVE blocks, so a block is often freed by another thread than
 * the one that allocated it (as with a framework's intra-op threads).  The
 * blocks are first filled by one thread in every case, and with one thread
 * the sequence of sizes is the same as without the argument.
 *
 * usage: large_churn STEPS LIVE MAX_MIB [THREADS] */
#include <pthread.h>

#include "bench.h"

#define PAGE 4096
#define MAX_THREADS 64

static char **block;
static long live;
static unsigned hi; /* sizes below 2^hi bytes */

struct worker {
    pthread_t tid;
    uint64_t rng;
    long steps;
    long first; /* step number of its first step, written into the pages */
    unsigned long long touched;
};

static char *fill(size_t n, long step)
{
    char *p = malloc(n);
    if (!p)
        abort();
    for (size_t off = 0; off < n; off += PAGE)
        p[off] = (char)step;
    return p;
}

static void *churn(void *arg)
{
    struct worker *w = arg;
    for (long i = 0; i < w->steps; i++) {
        long slot = (long)(bench_rand(&w->rng) % (uint64_t)live);
        size_t n = bench_size(&w->rng, 20, hi);
        /* Take the slot's block (another thread may have taken it: then
         * there is nothing to free), put a new one in, and free whatever
         * another thread put there meanwhile. */
        free(__atomic_exchange_n(&block[slot], NULL, __ATOMIC_ACQ_REL));
        char *p = fill(n, w->first + i);
        free(__atomic_exchange_n(&block[slot], p, __ATOMIC_ACQ_REL));
        w->touched += n;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    const char *usage = "STEPS LIVE MAX_MIB [THREADS]";
    long steps = bench_arg(argc, argv, 1, usage);
    live = bench_arg(argc, argv, 2, usage);
    long max_mib = bench_arg(argc, argv, 3, usage);
    long threads = argc > 4 ? bench_arg(argc, argv, 4, usage) : 1;
    if (threads > MAX_THREADS) {
        fprintf(stderr, "large_churn: at most %d threads\n", MAX_THREADS);
        return 2;
    }
    hi = 21;
    while (((long)1 << (hi - 20)) < max_mib)
        hi++;
    block = calloc((size_t)live, sizeof *block);
    if (!block)
        abort();

    struct worker w[MAX_THREADS] = {{.rng = BENCH_SEED}};
    double t0 = bench_now();
    for (long i = 0; i < live; i++) {
        size_t n = bench_size(&w[0].rng, 20, hi);
        block[i] = fill(n, i);
        w[0].touched += n;
    }
    for (long t = 0; t < threads; t++) {
        if (t > 0)
            w[t].rng = BENCH_SEED + (uint64_t)t;
        w[t].steps = steps / threads + (t < steps % threads);
        w[t].first = t > 0 ? w[t - 1].first + w[t - 1].steps : live;
        if (threads > 1 && pthread_create(&w[t].tid, NULL, churn, &w[t]))
            abort();
    }
    if (threads == 1)
        churn(&w[0]);
    unsigned long long touched = 0;
    for (long t = 0; t < threads; t++) {
        if (threads > 1)
            pthread_join(w[t].tid, NULL);
        touched += w[t].touched;
    }
    double secs = bench_now() - t0;
    long long rss = bench_rss_bytes();
    for (long i = 0; i < live; i++)
        free(block[i]);
    free(block);
    printf("{\"threads\": %ld, \"ops\": %ld, \"bytes_touched\": %llu, \"ms_per_step\": %.4f, \"rss_live\": %lld}\n",
           threads, steps, touched, secs * 1e3 / (double)(steps + live), rss);
    return 0;
}
