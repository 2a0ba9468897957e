/* release_burst.c - a burst of large blocks freed all at once: a model's
 * weights loaded into host memory and then unloaded.  Measures how much of
 * the freed memory the allocator gives back to the OS.
 *
 * Allocates BLOCKS x BLOCK_SIZE, writes every page, frees them all, and
 * reports RSS right after the frees (rss_after_unload) and again after a
 * phase of small malloc/free pairs (rss_after_churn) that lets allocators
 * which purge lazily on later activity catch up.
 *
 * With SETTLE_S, the process then sleeps that long without an allocator
 * call and reports RSS at the end (rss_settled): what an idle process that
 * unloaded a model gets back with no call of its own.  burst_s is the time
 * up to the end of the churn, without the sleep.
 *
 * With "small", the same 800 MiB is made of blocks of 1-8 KiB (a working
 * set of strings, containers or Python objects), which no allocator serves
 * as large blocks.
 *
 * usage: release_burst [SETTLE_S [small]] */
#include "bench.h"

#include <fcntl.h>
#include <string.h>

#define BLOCKS 200
#define BLOCK_SIZE ((size_t)4 << 20) /* 4 MiB: 800 MiB in all */
#define PAGE 4096
#define CHURN_PAIRS 200000
#define CHURN_SIZE 64

/* RSS without stdio: the settle phase must make no allocator call. */
static long long rss_raw(void)
{
    char buf[128];
    int fd = open("/proc/self/statm", O_RDONLY);
    ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
    if (fd >= 0)
        close(fd);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    char *sp = strchr(buf, ' ');
    return sp ? atoll(sp + 1) * sysconf(_SC_PAGESIZE) : -1;
}

#define SMALL_LO 1024
#define SMALL_HI 8192
#define SMALL_BLOCKS (BLOCKS * BLOCK_SIZE / ((SMALL_LO + SMALL_HI) / 2))

int main(int argc, char **argv)
{
    double settle = argc > 1 ? atof(argv[1]) : 0;
    int small = argc > 2 && strcmp(argv[2], "small") == 0;
    size_t blocks = small ? SMALL_BLOCKS : BLOCKS;
    char **block = calloc(blocks, sizeof *block);
    if (!block)
        abort();
    uint64_t rng = BENCH_SEED;
    double t0 = bench_now();
    long long rss_before = bench_rss_bytes();

    for (size_t i = 0; i < blocks; i++) {
        size_t n = small ? SMALL_LO + (size_t)(bench_rand(&rng) % (SMALL_HI - SMALL_LO + 1)) : BLOCK_SIZE;
        block[i] = malloc(n);
        if (!block[i])
            abort();
        for (size_t off = 0; off < n; off += small ? 512 : PAGE)
            block[i][off] = (char)i;
    }
    long long rss_peak = bench_rss_bytes();
    for (size_t i = 0; i < blocks; i++)
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
    double burst_s = bench_now() - t0;
    long long rss_settled = -1;
    if (settle > 0) {
        struct timespec ts = {(time_t)settle, (long)((settle - (double)(time_t)settle) * 1e9)};
        while (nanosleep(&ts, &ts) != 0)
            ;
        rss_settled = rss_raw();
    }

    printf("{\"rss_before\": %lld, \"rss_loaded\": %lld, \"rss_after_unload\": %lld, "
           "\"rss_after_churn\": %lld, \"rss_settled\": %lld, \"settled_above_before\": %lld, "
           "\"burst_s\": %.4f}\n",
           rss_before, rss_peak, rss_after_unload, rss_after_churn, rss_settled,
           settle > 0 ? rss_settled - rss_before : -1, burst_s);
    return 0;
}
