/* p_mixes.c - glibc semantics of the malloc family under the shim, and
 * memory allocated inside glibc freed by the program (and the reverse):
 * the mixes that crash a shim with incomplete coverage ("Attempt to free
 * invalid pointer").  Exit 0 when every check holds.  With "native" the
 * checks that hold for glibc alone: run without the shim, they show that
 * the others are glibc's own semantics. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <gnu/libc-version.h>
#include <locale.h>
#include <malloc.h>
#include <netdb.h>
#include <pwd.h>
#include <regex.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failures;
#define CHECK(cond)                                                             \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "p_mixes: %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                         \
        }                                                                       \
    } while (0)

static void *volatile sink;
static bool shim; /* false: "native", the checks that hold for glibc alone */
static size_t volatile huge = SIZE_MAX;

static int aligned(const void *p, size_t a) { return ((uintptr_t)p & (a - 1)) == 0; }

/* The failed-realloc checks use the pointer afterwards on purpose: a
 * failed realloc leaves the block alone. */
#pragma GCC diagnostic ignored "-Wuse-after-free"

static int cmp(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

static void semantics(void)
{
    long page = sysconf(_SC_PAGESIZE);

    /* free keeps errno, for small and large blocks and NULL. */
    size_t sizes[] = {0, 16, 4096, 300 * 1024, 8 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        void *p = malloc(sizes[i]);
        errno = 1234;
        free(p);
        CHECK(errno == 1234);
    }
    errno = 4321;
    free(NULL);
    CHECK(errno == 4321);

    /* Overflow and impossible sizes: NULL with ENOMEM. */
    errno = 0;
    CHECK(malloc(huge) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(calloc(huge / 2, 4) == NULL && errno == ENOMEM);
    void *keep = malloc(10);
    errno = 0;
    CHECK(reallocarray(keep, huge / 2, 4) == NULL && errno == ENOMEM);
    memset(keep, 1, 10); /* still ours after a failed reallocarray */
    errno = 0;
    CHECK(realloc(keep, huge) == NULL && errno == ENOMEM);
    free(keep);

    /* realloc as glibc: NULL pointer allocates; size 0 frees and returns NULL. */
    char *r = realloc(NULL, 100);
    CHECK(r != NULL);
    memset(r, 'a', 100);
    r = realloc(r, 100000);
    CHECK(r && r[99] == 'a');
    r = realloc(r, 50);
    CHECK(r && r[49] == 'a');
    CHECK(realloc(r, 0) == NULL);

    /* calloc returns zeroed memory even when reusing dirty blocks. */
    for (int i = 0; i < 100; i++) {
        char *d = malloc(1000);
        memset(d, 0xff, 1000);
        free(d);
        char *z = calloc(1, 1000);
        for (int k = 0; k < 1000; k++)
            if (z[k]) {
                CHECK(!"calloc memory not zero");
                break;
            }
        free(z);
    }

    /* Every block is aligned for any type (max_align_t: 16 bytes on x86-64
     * and AArch64), the smallest included, whichever call made it. */
    int misaligned = 0;
    const size_t m = _Alignof(max_align_t);
    for (size_t n = 0; n <= 32; n++) {
        void *b[7 * 16];
        for (int i = 0; i < 16; i++) {
            void **k = &b[7 * i];
            k[0] = malloc(n);
            k[1] = calloc(1, n);
            k[2] = realloc(NULL, n);
            k[3] = reallocarray(NULL, 1, n);
            k[4] = memalign(8, n);
            k[5] = aligned_alloc(8, n);
            k[6] = NULL;
            CHECK(posix_memalign(&k[6], sizeof(void *), n) == 0);
            char *big = malloc(200);
            char *shrunk = realloc(big, n ? n : 1);
            misaligned += !aligned(shrunk, m);
            free(shrunk);
        }
        for (int i = 0; i < 7 * 16; i++) {
            misaligned += !aligned(b[i], m);
            free(b[i]);
        }
    }
    CHECK(misaligned == 0);

    /* mallopt answers as glibc's: 1, but 0 for an M_MXFAST out of range. */
    CHECK(mallopt(M_MXFAST, 64) == 1 && mallopt(M_MXFAST, 0) == 1);
    CHECK(mallopt(M_MXFAST, -1) == 0 && mallopt(M_MXFAST, 1000) == 0);
    CHECK(mallopt(M_MMAP_THRESHOLD, 1 << 20) == 1 && mallopt(M_ARENA_MAX, 2) == 1 && mallopt(12345, 1) == 1);

    /* Alignment functions. */
    void *p = NULL;
    CHECK(posix_memalign(&p, 3, 10) == EINVAL && p == NULL);
    CHECK(posix_memalign(&p, sizeof(void *) / 2, 10) == EINVAL);
    CHECK(posix_memalign(&p, 0, 10) == EINVAL);
    errno = 0;
    CHECK(posix_memalign(&p, 1 << 20, 10) == 0 && aligned(p, 1 << 20) && errno == 0);
    CHECK(malloc_usable_size(p) >= 10);
    free(p);
    errno = 0;
    CHECK(posix_memalign(&p, 64, huge) == ENOMEM && errno == ENOMEM); /* glibc sets errno too */
    /* aligned_alloc: glibc >= 2.38 wants a power of two (C17, DR 460);
     * before, it was memalign, which rounds the alignment up. */
    unsigned major = 0, minor = 0;
    sscanf(gnu_get_libc_version(), "%u.%u", &major, &minor);
    errno = 0;
    if (major > 2 || (major == 2 && minor >= 38)) {
        CHECK(aligned_alloc(24, 48) == NULL && errno == EINVAL);
        CHECK(aligned_alloc(0, 48) == NULL);
    } else {
        p = aligned_alloc(24, 48);
        CHECK(p && aligned(p, 32) && errno == 0);
        free(p);
        p = aligned_alloc(0, 48);
        CHECK(p && errno == 0);
        free(p);
    }
    p = aligned_alloc(4096, 4096);
    CHECK(p && aligned(p, 4096));
    free(p);
    p = memalign(24, 100); /* glibc rounds up to a power of two */
    CHECK(p && aligned(p, 32));
    free(p);
    errno = 0;
    CHECK(memalign(huge, 10) == NULL && errno == EINVAL);
    p = valloc(1);
    CHECK(p && aligned(p, (size_t)page));
    free(p);
    p = pvalloc(0);
    CHECK(p && aligned(p, (size_t)page));
    CHECK(!shim || malloc_usable_size(p) >= (size_t)page); /* ours: a whole page */
    free(p);
    errno = 0;
    CHECK(pvalloc(huge - 10) == NULL && errno == ENOMEM);
    CHECK(malloc_usable_size(NULL) == 0);

    /* The names glibc exports but no longer declares (or only from 2.39:
     * free_sized); the shim exports them all. */
    if (!shim)
        return;
    void (*cfree_fn)(void *) = (void (*)(void *))dlsym(RTLD_DEFAULT, "cfree");
    void (*free_sized_fn)(void *, size_t) = (void (*)(void *, size_t))dlsym(RTLD_DEFAULT, "free_sized");
    void *(*libc_malloc)(size_t) = (void *(*)(size_t))dlsym(RTLD_DEFAULT, "__libc_malloc");
    CHECK(cfree_fn && free_sized_fn && libc_malloc);
    if (cfree_fn && free_sized_fn && libc_malloc) {
        cfree_fn(malloc(10));
        free_sized_fn(malloc(100), 100);
        free(libc_malloc(77)); /* __libc_malloc and free are one allocator */
    }
}

static void glibc_mixes(void)
{
    /* posix_memalign + malloc_usable_size + free: the users' crash. */
    for (int i = 0; i < 1000; i++) {
        void *p;
        if (posix_memalign(&p, 64, (size_t)(i * 37 % 5000) + 1) == 0) {
            CHECK(malloc_usable_size(p) >= (size_t)(i * 37 % 5000) + 1);
            p = realloc(p, 6000);
            free(p);
        }
    }
    /* Memory glibc allocates, freed here. */
    char *s = strdup("hello");
    free(s);
    char *a = NULL;
    CHECK(asprintf(&a, "%d-%s", 42, "x") > 0);
    free(a);
    FILE *f = fopen("/proc/self/status", "r");
    CHECK(f != NULL);
    char *line = NULL;
    size_t cap = 0;
    int lines = 0;
    while (f && getline(&line, &cap, f) > 0)
        lines++;
    CHECK(lines > 5);
    free(line);
    if (f)
        fclose(f);
    DIR *d = opendir("/proc/self/fd");
    CHECK(d != NULL);
    while (d && readdir(d))
        ;
    if (d)
        closedir(d);
    int n = 200000, *arr = malloc(sizeof(int) * (size_t)n);
    for (int i = 0; i < n; i++)
        arr[i] = (i * 7919) % n;
    qsort(arr, (size_t)n, sizeof(int), cmp); /* qsort mallocs a merge buffer */
    CHECK(arr[0] == 0 && arr[n - 1] == n - 1);
    free(arr);
    regex_t re;
    CHECK(regcomp(&re, "^[a-z]+[0-9]*$", REG_EXTENDED) == 0);
    CHECK(regexec(&re, "abc123", 0, NULL, 0) == 0);
    regfree(&re);
    setlocale(LC_ALL, "C.UTF-8");
    struct passwd *pw = getpwuid(getuid()); /* NSS: dlopen'd modules allocate */
    (void)pw;
    struct addrinfo *ai = NULL;
    if (getaddrinfo("localhost", "80", NULL, &ai) == 0)
        freeaddrinfo(ai);
    char *cwd = getcwd(NULL, 0);
    CHECK(cwd != NULL);
    free(cwd);
    char *rp = realpath("/proc/self/exe", NULL);
    CHECK(rp != NULL);
    free(rp);
}

int main(int argc, char **argv)
{
    shim = !(argc > 1 && strcmp(argv[1], "native") == 0);
    semantics();
    glibc_mixes();
    return failures ? 1 : 0;
}
