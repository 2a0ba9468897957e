/* fault_cost.c - what the kernel charges per page for the faults a fork
 * leaves behind, without any allocator: writes one byte per page of an
 * anonymous mapping (huge pages off) and times, per round,
 *   fork_ms   a fork and wait with the mapping resident (page tables copied)
 *   wp_ms     the writes after it (each page write-protected by the fork)
 *   madv_ms   madvise(MADV_DONTNEED) of the whole mapping
 *   zero_ms   the writes after that (each faults in a fresh zero page)
 * and prints one JSON line per round, with the same per page in µs.
 * Which of wp and zero is dearer decides whether an allocator should keep
 * its free memory across a fork (docs/performance.md, "Forks per task").
 *
 * usage: fault_cost MIB ROUNDS */
#include <sys/mman.h>

#include "bench.h"

#define PAGE 4096

static void write_pages(char *p, size_t n, int v)
{
    for (size_t off = 0; off < n; off += PAGE)
        p[off] = (char)v;
    bench_escape(p);
}

int main(int argc, char **argv)
{
    size_t n = (size_t)bench_arg(argc, argv, 1, "MIB ROUNDS") << 20;
    long rounds = bench_arg(argc, argv, 2, "MIB ROUNDS");
    char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        abort();
    madvise(p, n, MADV_NOHUGEPAGE);
    write_pages(p, n, 1);
    double pages = (double)(n / PAGE);
    for (long r = 0; r < rounds; r++) {
        double t0 = bench_now();
        bench_fork_wait();
        double t1 = bench_now();
        write_pages(p, n, 2);
        double t2 = bench_now();
        if (madvise(p, n, MADV_DONTNEED) != 0)
            abort();
        double t3 = bench_now();
        write_pages(p, n, 3);
        double t4 = bench_now();
        printf("{\"fork_ms\": %.1f, \"wp_ms\": %.1f, \"madv_ms\": %.1f, \"zero_ms\": %.1f, \"fork_us_per_page\": %.2f, "
               "\"wp_us_per_page\": %.2f, \"madv_us_per_page\": %.2f, \"zero_us_per_page\": %.2f}\n",
               (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3, (t4 - t3) * 1e3, (t1 - t0) * 1e6 / pages,
               (t2 - t1) * 1e6 / pages, (t3 - t2) * 1e6 / pages, (t4 - t3) * 1e6 / pages);
    }
    return 0;
}
