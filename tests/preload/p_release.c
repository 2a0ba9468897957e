/* p_release.c - the host release patterns and glibc introspection.
 *
 *   p_release burst    200 x 4 MB allocated, touched, all freed (a model
 *                      unload); prints "rss_after_free_mb N"
 *   p_release churn    allocate, touch, free blocks of 1-32 MB, 300 times
 *                      (repeated large allocations); prints the number of
 *                      releases forgealloc made: "releases N"
 *   p_release intro    mallinfo/mallinfo2, malloc_trim, mallopt,
 *                      malloc_stats, malloc_info; exit 0 when they answer
 *                      for the real allocator */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MB (1024 * 1024)

static long rss_mb(void)
{
    long pages = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f || fscanf(f, "%ld %ld", &pages, &rss) != 2)
        return -1;
    fclose(f);
    return rss * sysconf(_SC_PAGESIZE) / MB;
}

static void touch(char *p, size_t n)
{
    for (size_t i = 0; i < n; i += 4096)
        p[i] = (char)i;
}

static uint64_t stat_of(const char *key)
{
    int (*fn)(const char *, uint64_t *) = (int (*)(const char *, uint64_t *))dlsym(RTLD_DEFAULT, "forgealloc_stat");
    uint64_t v = 0;
    if (!fn || fn(key, &v) != 0)
        return UINT64_MAX;
    return v;
}

static int failures;
#define CHECK(cond)                                                               \
    do {                                                                          \
        if (!(cond)) {                                                            \
            fprintf(stderr, "p_release: %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                           \
        }                                                                         \
    } while (0)

static int intro(void)
{
    const size_t live = 64 * MB;
    struct mallinfo2 before = mallinfo2();
    char *p = malloc(live);
    touch(p, live);
    struct mallinfo2 m = mallinfo2();
    CHECK(m.uordblks >= before.uordblks + live);
    CHECK(m.uordblks < before.uordblks + live + 4 * MB);
    CHECK(m.arena >= m.uordblks);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    struct mallinfo old = mallinfo(); /* still used by old programs */
#pragma GCC diagnostic pop
    CHECK((size_t)old.uordblks >= live);
    free(p);
    m = mallinfo2();
    CHECK(m.uordblks < before.uordblks + MB);
    /* Freed but kept: malloc_trim gives it back. */
    char *q = malloc(32 * MB);
    touch(q, 32 * MB);
    free(q);
    CHECK(malloc_trim(0) == 1);
    CHECK(mallinfo2().keepcost < MB);
    CHECK(mallopt(M_MMAP_THRESHOLD, 1 << 20) == 1);
    CHECK(mallopt(M_ARENA_MAX, 2) == 1);
    FILE *mem = tmpfile();
    CHECK(malloc_info(0, mem) == 0);
    CHECK(malloc_info(1, mem) == -1);
    rewind(mem);
    char buf[256] = "";
    CHECK(fgets(buf, sizeof buf, mem) && strstr(buf, "<malloc version=") != NULL);
    fclose(mem);
    fflush(stdout);
    malloc_stats(); /* our text report on stderr; run.py checks it */
    return failures;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "burst") == 0) {
        enum { N = 200 };
        static char *blocks[N];
        for (int i = 0; i < N; i++) {
            blocks[i] = malloc(4 * MB);
            touch(blocks[i], 4 * MB);
        }
        printf("rss_peak_mb %ld\n", rss_mb());
        for (int i = 0; i < N; i++)
            free(blocks[i]);
        printf("rss_after_free_mb %ld\n", rss_mb());
        return 0;
    }
    if (strcmp(mode, "churn") == 0) {
        uint64_t before = stat_of("host.releases");
        unsigned seed = 12345;
        for (int i = 0; i < 300; i++) {
            seed = seed * 1103515245u + 12345u;
            size_t n = (size_t)(1 + (seed >> 16) % 32) * MB;
            char *p = malloc(n);
            touch(p, n);
            free(p);
        }
        printf("releases %llu\n", (unsigned long long)(stat_of("host.releases") - before));
        return 0;
    }
    if (strcmp(mode, "intro") == 0)
        return intro() ? 1 : 0;
    fprintf(stderr, "usage: p_release burst|churn|intro\n");
    return 2;
}
