/* release_burst.c - a burst of large blocks freed all at once: a model's
 * weights loaded into host memory and then unloaded.  Measures how much of
 * the freed memory the allocator gives back to the OS.
 *
 * Allocates BLOCKS x BLOCK_SIZE, writes every page, frees them all, and
 * reports RSS right after the frees (rss_after_unload) and again after a
 * phase of small malloc/free pairs (rss_after_churn) that lets allocators
 * which purge lazily on later activity catch up.
 *
 * usage: release_burst */
#include "bench.h"

#define BLOCKS 200
#define BLOCK_SIZE ((size_t)4 << 20) /* 4 MiB: 800 MiB in all */
#define PAGE 4096
#define CHURN_PAIRS 200000
#define CHURN_SIZE 64

int main(void)
{
    static char *block[BLOCKS];
    long long rss_before = bench_rss_bytes();

    for (int i = 0; i < BLOCKS; i++) {
        block[i] = malloc(BLOCK_SIZE);
        if (!block[i])
            abort();
        for (size_t off = 0; off < BLOCK_SIZE; off += PAGE)
            block[i][off] = (char)i;
    }
    long long rss_peak = bench_rss_bytes();
    for (int i = 0; i < BLOCKS; i++)
        free(block[i]);
    long long rss_after_unload = bench_rss_bytes();

    for (int i = 0; i < CHURN_PAIRS; i++) {
        char *p = malloc(CHURN_SIZE);
        if (!p)
            abort();
        p[0] = (char)i;
        bench_escape(p);
        free(p);
    }
    long long rss_after_churn = bench_rss_bytes();

    printf("{\"rss_before\": %lld, \"rss_loaded\": %lld, \"rss_after_unload\": %lld, "
           "\"rss_after_churn\": %lld}\n",
           rss_before, rss_peak, rss_after_unload, rss_after_churn);
    return 0;
}
