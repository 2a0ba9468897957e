/* bench.h - helpers shared by the benchmark workloads: a deterministic PRNG,
 * a monotonic clock, the resident set size, an optimisation barrier, and a
 * child forked and waited for.
 *
 * Each workload prints one JSON object on its last stdout line; the runner
 * (run.py) measures wall time, CPU time and peak RSS from outside. */
#ifndef FA_BENCH_H
#define FA_BENCH_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Every workload seeds from this, so runs under all allocators see the same
 * sequence of sizes and lifetimes. */
#define BENCH_SEED 0x5EEDF00DCAFEULL

/* splitmix64: tiny, fast, good enough to pick sizes and slots. */
static inline uint64_t bench_rand(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* Log-uniform size in [2^lo_log2, 2^hi_log2): small sizes as common as large
 * ones per power of two, as in real programs. */
static inline size_t bench_size(uint64_t *state, unsigned lo_log2, unsigned hi_log2)
{
    uint64_t r = bench_rand(state);
    unsigned e = lo_log2 + (unsigned)(r % (hi_log2 - lo_log2));
    size_t base = (size_t)1 << e;
    return base + (size_t)((r >> 32) % base);
}

static inline double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Resident set size in bytes, from /proc/self/statm (second field). */
static inline long long bench_rss_bytes(void)
{
    long long pages_total = 0, pages_resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f)
        return -1;
    if (fscanf(f, "%lld %lld", &pages_total, &pages_resident) != 2)
        pages_resident = -1;
    fclose(f);
    return pages_resident < 0 ? -1 : pages_resident * sysconf(_SC_PAGESIZE);
}

/* Make the compiler assume p escapes, so malloc/touch/free is not elided. */
static inline void bench_escape(void *p)
{
    __asm__ volatile("" : : "r"(p) : "memory");
}

/* Fork a child that exits at once, and wait for it; abort on any failure. */
static inline void bench_fork_wait(void)
{
    pid_t pid = fork();
    if (pid < 0)
        abort();
    if (pid == 0)
        _exit(0);
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
        abort();
}

/* Parse a positive count from argv, or exit with a usage message. */
static inline long bench_arg(int argc, char **argv, int i, const char *usage)
{
    char *end;
    long v = i < argc ? strtol(argv[i], &end, 10) : 0;
    if (i >= argc || *end || v <= 0) {
        fprintf(stderr, "usage: %s %s\n", argv[0], usage);
        exit(2);
    }
    return v;
}

#endif
