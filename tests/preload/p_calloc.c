/* p_calloc.c - large callocs: fresh memory, reused memory, threads.
 *
 *   p_calloc   0. calloc(3 MiB), below the size forgealloc clears itself:
 *                 tcmalloc's own calloc, whose memset is libc's again once
 *                 the library has started; prints "small_resident_kib N";
 *              1. calloc(64 MiB) of fresh memory: prints
 *                 "fresh_resident_kib N" (the block's resident pages right
 *                 after the call, before anything reads it), then checks it
 *                 reads as zeros;
 *              2. blocks of several sizes filled with 0xa5 and freed, then
 *                 calloc'd again (tcmalloc hands the same memory back):
 *                 every byte must be zero;
 *              3. two threads doing the same 48 times each (each size 8
 *                 times; between the two, each size in both forms of the
 *                 call).
 *              Exit 0 when every calloc'd byte read zero, 1 otherwise. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)

static size_t resident_kib(const void *p, size_t n)
{
    int fd = open("/proc/self/pagemap", O_RDONLY);
    if (fd < 0)
        return SIZE_MAX;
    size_t page = (size_t)sysconf(_SC_PAGESIZE), kib = 0;
    for (uintptr_t a = (uintptr_t)p / page * page; a < (uintptr_t)p + n; a += page) {
        uint64_t e = 0;
        if (pread(fd, &e, sizeof e, (off_t)(a / page * sizeof e)) == sizeof e && (e >> 63))
            kib += page / 1024;
    }
    close(fd);
    return kib;
}

static int zeros(const unsigned char *p, size_t n, const char *what, size_t size)
{
    for (size_t i = 0; i < n; i++)
        if (p[i]) {
            fprintf(stderr, "p_calloc: %s of %zu bytes: byte %zu is 0x%02x\n", what, size, i, p[i]);
            return 0;
        }
    return 1;
}

/* Fill blocks of each size, free them, calloc them again. */
static int reuse(unsigned seed, int rounds)
{
    static const size_t sizes[] = {4 * MIB, 4 * MIB + 1, 5 * MIB + 123, 8 * MIB, 33 * MIB - 7, 64 * MIB};
    const size_t count = sizeof sizes / sizeof *sizes;
    for (int r = 0; r < rounds; r++) {
        size_t n = sizes[(seed + (unsigned)r) % count];
        unsigned char *dirty = malloc(n);
        if (!dirty)
            return 0;
        memset(dirty, 0xa5, n);
        __asm__ volatile("" ::"r"(dirty) : "memory");
        free(dirty);
        /* calloc(count, size) as well as calloc(1, n) */
        unsigned char *p = (r & 1) ? calloc(n / 8, 8) : calloc(1, n);
        size_t got = (r & 1) ? n / 8 * 8 : n;
        if (!p || !zeros(p, got, "calloc of reused memory", got))
            return 0;
        memset(p, 0x5a, got);
        __asm__ volatile("" ::"r"(p) : "memory");
        free(p);
    }
    return 1;
}

static void *worker(void *arg) { return reuse((unsigned)(uintptr_t)arg, 48) ? arg : NULL; }

int main(void)
{
    unsigned char *small = calloc(1, 3 * MIB);
    if (!small)
        return 1;
    printf("small_resident_kib %zu\n", resident_kib(small, 3 * MIB));
    if (!zeros(small, 3 * MIB, "calloc", 3 * MIB))
        return 1;
    free(small);
    size_t n = 64 * MIB;
    unsigned char *fresh = calloc(1, n);
    if (!fresh)
        return 1;
    printf("fresh_resident_kib %zu\n", resident_kib(fresh, n));
    fflush(stdout);
    if (!zeros(fresh, n, "calloc of fresh memory", n))
        return 1;
    free(fresh);
    if (!reuse(0, 24))
        return 1;
    pthread_t t[2];
    for (uintptr_t i = 0; i < 2; i++)
        if (pthread_create(&t[i], NULL, worker, (void *)(i + 1)))
            return 1;
    int ok = 1;
    for (int i = 0; i < 2; i++) {
        void *r;
        pthread_join(t[i], &r);
        ok &= r != NULL;
    }
    return ok ? 0 : 1;
}
