/* p_release.c - the host release patterns and glibc introspection.
 *
 *   p_release burst [S] 200 x 4 MB allocated, touched, all freed (a model
 *                      unload); prints "rss_after_free_mb N", then sleeps
 *                      S seconds (no allocator call) printing
 *                      "rss_settled_mb N after_ms T" once RSS is within
 *                      64 MB of where it started, and "rss_end_mb N"
 *   p_release fork S   the burst in a child forked after the parent made
 *                      its own burst: both settle (lines prefixed
 *                      "parent"/"child")
 *   p_release churn    allocate, touch, free blocks of 1-32 MB, 300 times
 *                      (repeated large allocations); prints the number of
 *                      releases forgealloc made: "releases N"
 *   p_release churn16 N  16 live blocks of 1-32 MB (log-uniform), one
 *                      freed and re-allocated per step for N steps, every
 *                      page touched; prints "releases N"
 *   p_release prompt N GAP_MS  N cycles of: 160 MB in 4 MB blocks
 *                      allocated, touched, all freed, GAP_MS asleep (a text
 *                      encoder moved to the host per prompt); prints
 *                      "returned_mb" per cycle and "hold_ms", then sleeps
 *                      until RSS is within 64 MB of its start:
 *                      "settled_after_ms T" (-1: not within 20 s)
 *   p_release calls S  200 x 4 MB allocated, touched, all freed, S seconds
 *                      without an allocator call: "rss_before_call_mb N";
 *                      then one 8 MB block allocated, touched and freed:
 *                      "rss_after_call_mb N" (where no thread can start,
 *                      memory goes back on such calls)
 *   p_release small LO HI MB S  MB in blocks of LO..HI bytes (all below
 *                      tcmalloc's 256 KiB large size) allocated, touched,
 *                      all freed; the RSS while the process sleeps S seconds
 *                      making no allocator call, as burst prints it
 *   p_release hold MB S  MB in 4 MB blocks allocated, touched, all freed;
 *                      prints "freed", sleeps S seconds, prints RSS
 *   p_release need MB  allocates and touches MB; prints "got"
 *   p_release realloc  two 8 MB blocks, a realloc of one that fails, both
 *                      freed: prints "releases N" (the failed realloc must
 *                      leave the block known to the release policy)
 *   p_release grow     a buffer grown by realloc to 512 MiB, its bytes
 *                      checked: "peak_mb N final_mb N grown_mb N"; shrunk,
 *                      grown, resized and freed by a forked child, freed:
 *                      "grown_mb_after_free N"
 *   p_release forkrel N  N rounds of: 160 MB freed (the background thread
 *                      releasing), fork at varying moments, the child
 *                      allocates and exits; exit 1 if a child hangs
 *   p_release threads  prints "helper_threads N": threads named
 *                      forgealloc, after small allocations only, then
 *                      after a large burst was freed
 *   p_release retire S two rounds of: a burst freed, then "helper_threads_busy
 *                      N" and "helper_threads_retired N after_ms T" once
 *                      the thread exited (or S seconds passed)
 *   p_release tlsjoin LIB  threads use LIB's 12 MiB thread-local buffer
 *                      (dynamic TLS, which ld.so allocates with malloc and
 *                      frees while glibc holds its stack-cache lock), exit
 *                      and are joined, 4 rounds of 8; prints "done"
 *   p_release errno    the address space used up but for 1 MiB, then
 *                      malloc(1 MiB), the process's first large block
 *                      (tcmalloc serves it from memory it holds; the
 *                      shim's table for it cannot be mapped): prints
 *                      "ok 1 errno N" (0: errno left as it was)
 *   p_release twice N  N rounds of: 32 MB freed, two threads call
 *                      forgealloc_release at once; prints "unmapped_mb N
 *                      returned_mb N counted_mb N"
 *   p_release inherit S  256 MB freed, fork: the child waits 150 ms, makes
 *                      300 small allocations and sleeps S seconds (no
 *                      other call): "child rss_start_mb N rss_end_mb N"
 *   p_release forkkeep S  256 MB freed; once the background thread runs,
 *                      fork (the child exits at once), then, as Python 3.12
 *                      does right after fork(), count the threads with
 *                      stdio; S seconds later the parent makes small
 *                      allocations and waits until RSS is within 64 MB of
 *                      its start: "threads_after_fork N rss_start_mb N
 *                      rss_after_fork_mb N settled_after_ms T" (-1: not
 *                      within 20 s)
 *   p_release steps LIVE STEP N  LIVE MB allocated and touched and kept,
 *                      then N steps of: STEP MB in 4 MB blocks allocated,
 *                      touched, all freed, 20 ms asleep (a training or
 *                      generation step's buffers); prints "step_ms_median
 *                      X pressure_mb N releases N"
 *   p_release apierrno  forgealloc_stats_json, forgealloc_stat,
 *                      forgealloc_stats_write and malloc_stats with errno
 *                      set before: "errno kept N of 4"
 *   p_release intro    mallinfo/mallinfo2, malloc_trim, mallopt,
 *                      malloc_stats, malloc_info; exit 0 when they answer
 *                      for the real allocator */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <malloc.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MB (1024 * 1024)

/* Read without stdio: a look at the RSS makes no allocator call (the
 * policy also runs on frees). */
static long rss_mb(void)
{
    char buf[128];
    int fd = open("/proc/self/statm", O_RDONLY);
    ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
    if (fd >= 0)
        close(fd);
    long pages = 0, rss = 0;
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    if (sscanf(buf, "%ld %ld", &pages, &rss) != 2)
        return -1;
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

/* n blocks of 4 MB allocated, every page written, all freed. */
static void free_burst(int n)
{
    char *b[64];
    for (int i = 0; i < n; i++) {
        b[i] = malloc(4 * MB);
        touch(b[i], 4 * MB);
    }
    for (int i = 0; i < n; i++)
        free(b[i]);
}

static int failures;
#define CHECK(cond)                                                               \
    do {                                                                          \
        if (!(cond)) {                                                            \
            fprintf(stderr, "p_release: %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                           \
        }                                                                         \
    } while (0)

/* One byte per 4 KiB page, from the page's number. */
static bool pattern_ok(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i += 4096)
        if (p[i] != (unsigned char)(i / 4096 * 7 + 1))
            return false;
    return true;
}
static void pattern(unsigned char *p, size_t from, size_t to)
{
    for (size_t i = (from + 4095) & ~(size_t)4095; i < to; i += 4096)
        p[i] = (unsigned char)(i / 4096 * 7 + 1);
}

/* A buffer grown by realloc from 64 KiB, 1.5x a step, to 512 MiB, the new
 * bytes written each step; shrunk, grown again, and used across a fork. */
static int grow(void)
{
    size_t n = 0, top = 512 * MB;
    unsigned char *p = NULL;
    while (n < top) {
        size_t m = n ? n + n / 2 : 64 * 1024;
        if (m > top)
            m = top;
        unsigned char *q = realloc(p, m);
        CHECK(q != NULL);
        if (!q)
            return failures;
        p = q;
        pattern(p, n, m);
        n = m;
    }
    CHECK(pattern_ok(p, n));
    CHECK(malloc_usable_size(p) >= n);
    long peak = 0;
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %ld", &peak) == 1)
            peak /= 1024;
    if (f)
        fclose(f);
    printf("peak_mb %ld final_mb %zu grown_mb %llu\n", peak, n / MB,
           (unsigned long long)(stat_of("host.grown_bytes") / MB));
    p = realloc(p, 3 * MB + 5); /* shrunk: the first bytes stay */
    CHECK(p && pattern_ok(p, 3 * MB));
    p = realloc(p, 40 * MB);
    CHECK(p && pattern_ok(p, 3 * MB));
    pid_t pid = fork();
    if (pid == 0) { /* the child's copy is its own to resize and free */
        unsigned char *c = realloc(p, 80 * MB);
        int ok = c && pattern_ok(c, 3 * MB);
        free(c);
        _exit(ok ? 0 : 1);
    }
    int status = -1;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(pattern_ok(p, 3 * MB));
    free(p);
    printf("grown_mb_after_free %llu\n", (unsigned long long)(stat_of("host.grown_bytes") / MB));
    return failures;
}

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
    errno = 0;
    CHECK(malloc_info(1, mem) == EINVAL && errno == 0); /* glibc returns the error, errno untouched */
    rewind(mem);
    char buf[256] = "";
    CHECK(fgets(buf, sizeof buf, mem) && strstr(buf, "<malloc version=") != NULL);
    fclose(mem);
    fflush(stdout);
    malloc_stats(); /* our text report on stderr; run.py checks it */
    return failures;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Threads of this process as the kernel counts them (/proc/self/stat,
 * field 20). */
static int kernel_threads(void)
{
    char buf[1024] = "";
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* after the command name */
    int field = 2, threads = -1;
    for (; p && *p; p++)
        if (*p == ' ' && ++field == 20) {
            threads = atoi(p + 1);
            break;
        }
    return threads;
}

/* Threads of this process named "forgealloc". */
static int helper_threads(void)
{
    DIR *d = opendir("/proc/self/task");
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        char path[300], comm[64] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        if (fgets(comm, sizeof comm, f) && strcmp(comm, "forgealloc\n") == 0)
            n++;
        fclose(f);
    }
    if (d)
        closedir(d);
    return n;
}

/* The forgealloc threads once one shows, or 0 after 2 s: the thread names
 * itself when it first runs, which on a loaded machine may take a while
 * after its start. */
static int helper_threads_soon(void)
{
    double t0 = now_s();
    int n;
    struct timespec poll = {0, 5 * 1000000L};
    while ((n = helper_threads()) == 0 && now_s() - t0 < 2)
        nanosleep(&poll, NULL);
    return n;
}

/* Milliseconds until RSS is within 64 MB of `start`, looked at every 50 ms
 * with no allocator call (-1: not within 20 s). */
static long ms_until_settled(long start)
{
    for (long ms = 0; ms <= 20000; ms += 50) {
        if (rss_mb() <= start + 64)
            return ms;
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return -1;
}

/* 200 x 4 MB allocated, touched, freed; then `settle` seconds without an
 * allocator call (stdio buffers were allocated before the burst). */
/* Right after the frees: "rss_after_free_mb", then `settle` seconds of
 * sleep with no allocator call, "rss_settled_mb N after_ms T" once RSS is
 * within 64 MB of `before`, and "rss_end_mb". */
static void sleep_watching(const char *who, long before, double settle)
{
    double t0 = now_s();
    printf("%srss_after_free_mb %ld\n", who, rss_mb());
    fflush(stdout);
    int settled = 0;
    while (now_s() - t0 < settle) {
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
        long r = rss_mb();
        if (!settled && r <= before + 64) {
            printf("%srss_settled_mb %ld after_ms %d\n", who, r, (int)((now_s() - t0) * 1000));
            fflush(stdout);
            settled = 1;
        }
    }
    printf("%srss_end_mb %ld\n", who, rss_mb());
    fflush(stdout);
}

static void burst(const char *who, double settle)
{
    enum { N = 200 };
    static char *blocks[N];
    long before = rss_mb();
    for (int i = 0; i < N; i++) {
        blocks[i] = malloc(4 * MB);
        touch(blocks[i], 4 * MB);
    }
    printf("%srss_peak_mb %ld\n", who, rss_mb());
    for (int i = 0; i < N; i++)
        free(blocks[i]);
    sleep_watching(who, before, settle);
}

static void (*tls_touch)(void);
static void *tls_user(void *arg) { return tls_touch(), arg; }

static volatile int twice_go;
static void *twice_release(void *arg)
{
    size_t (*release)(void) = (size_t (*)(void))dlsym(RTLD_DEFAULT, "forgealloc_release");
    while (!__atomic_load_n(&twice_go, __ATOMIC_ACQUIRE))
        ;
    *(size_t *)arg = release();
    return NULL;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    double arg = argc > 2 ? atof(argv[2]) : 0;
    if (strcmp(mode, "burst") == 0) {
        burst("", arg);
        return 0;
    }
    if (strcmp(mode, "fork") == 0) {
        setvbuf(stdout, NULL, _IOLBF, 0);
        burst("parent ", 0);
        pid_t pid = fork();
        if (pid == 0) {
            burst("child ", arg);
            _exit(0);
        }
        burst("parent ", arg);
        int status = 0;
        waitpid(pid, &status, 0);
        return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    }
    if (strcmp(mode, "small") == 0 && argc > 5) {
        size_t lo = strtoul(argv[2], NULL, 10), hi = strtoul(argv[3], NULL, 10);
        size_t total = strtoul(argv[4], NULL, 10) * MB, n = total / ((lo + hi) / 2) + 1, got = 0;
        char **blocks = malloc(n * sizeof *blocks);
        long before = rss_mb();
        uint64_t rng = 12345;
        size_t k = 0;
        for (; k < n && got < total; k++) {
            rng = rng * 6364136223846793005u + 1442695040888963407u;
            size_t size = lo + (size_t)(rng >> 33) % (hi - lo + 1);
            blocks[k] = malloc(size);
            memset(blocks[k], 1, size);
            got += size;
        }
        printf("rss_start_mb %ld\nrss_peak_mb %ld\n", before, rss_mb());
        for (size_t i = 0; i < k; i++)
            free(blocks[i]);
        free(blocks);
        sleep_watching("", before, atof(argv[5]));
        return 0;
    }
    if (strcmp(mode, "calls") == 0) {
        long before = rss_mb();
        burst("", arg);
        printf("rss_start_mb %ld\nrss_before_call_mb %ld\n", before, rss_mb());
        char *p = malloc(8 * MB);
        touch(p, 8 * MB);
        free(p);
        printf("rss_after_call_mb %ld\n", rss_mb());
        return 0;
    }
    if (strcmp(mode, "hold") == 0 || strcmp(mode, "need") == 0) {
        int n = (int)arg / 4;
        char **blocks = calloc((size_t)n, sizeof *blocks);
        for (int i = 0; i < n; i++) {
            blocks[i] = malloc(4 * MB);
            touch(blocks[i], 4 * MB);
        }
        if (mode[0] == 'n') {
            printf("got\n");
            return 0;
        }
        for (int i = 0; i < n; i++)
            free(blocks[i]);
        printf("freed\n");
        fflush(stdout);
        double settle = argc > 3 ? atof(argv[3]) : 0;
        struct timespec ts = {(time_t)settle, 0};
        nanosleep(&ts, NULL);
        printf("rss_end_mb %ld\n", rss_mb());
        return 0;
    }
    if (strcmp(mode, "realloc") == 0) {
        static size_t volatile huge = SIZE_MAX / 2;
        uint64_t before = stat_of("host.releases");
        char *a = malloc(8 * MB), *b = malloc(8 * MB);
        touch(a, 8 * MB);
        touch(b, 8 * MB);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuse-after-free"
        CHECK(realloc(a, huge) == NULL);
        a[1] = 1; /* still ours */
#pragma GCC diagnostic pop
        free(a);
        free(b);
        printf("releases %llu\n", (unsigned long long)(stat_of("host.releases") - before));
        return failures;
    }
    if (strcmp(mode, "grow") == 0)
        return grow();
    if (strcmp(mode, "forkrel") == 0) {
        for (int round = 0; round < (int)arg; round++) {
            free_burst(40);
            struct timespec ts = {0, (round % 7) * 3000000L};
            nanosleep(&ts, NULL);
            pid_t pid = fork();
            if (pid == 0) {
                char *c = malloc(8 * MB);
                touch(c, 8 * MB);
                free(c);
                _exit(0);
            }
            int status = 0, w;
            for (w = 0; w < 1000 && waitpid(pid, &status, WNOHANG) != pid; w++) {
                struct timespec tick = {0, 10 * 1000000L};
                nanosleep(&tick, NULL);
            }
            if (w == 1000) {
                fprintf(stderr, "p_release: child %d hung in round %d\n", (int)pid, round);
                kill(pid, SIGKILL);
                return 1;
            }
        }
        return 0;
    }
    if (strcmp(mode, "threads") == 0) {
        for (int i = 0; i < 1000; i++)
            free(malloc((size_t)(i % 64) * 1024 + 1));
        char *one = malloc(2 * MB); /* a lone large block: below the threshold */
        free(one);
        printf("helper_threads_small %d\n", helper_threads());
        burst("", 0);
        printf("helper_threads_after_burst %d\n", helper_threads_soon());
        /* A fork now: the thread leaves before it, so the process forks
         * with one thread (the count Python 3.12's os.fork warns on); the
         * memory freed just before stays. */
        fflush(stdout);
        long rss = rss_mb();
        pid_t pid = fork();
        if (pid == 0)
            _exit(kernel_threads() == 1 ? 0 : 3);
        printf("threads_after_fork %d rss_drop_mb %ld\n", kernel_threads(), rss - rss_mb());
        int status = 0;
        waitpid(pid, &status, 0);
        printf("child_single_threaded %d\n", WIFEXITED(status) && WEXITSTATUS(status) == 0);
        burst("", 0); /* the next burst starts the thread again */
        printf("helper_threads_after_fork_burst %d\n", helper_threads_soon());
        return 0;
    }
    if (strcmp(mode, "retire") == 0) {
        /* Twice: a burst starts the thread; once the memory went back and
         * nothing is left to judge, it exits (within `arg` seconds). */
        for (int round = 0; round < 2; round++) {
            burst("", 0);
            printf("helper_threads_busy %d\n", helper_threads_soon());
            struct timespec ts = {0, 100 * 1000000L};
            double t0 = now_s();
            int n;
            while ((n = helper_threads()) > 0 && now_s() - t0 < arg)
                nanosleep(&ts, NULL);
            printf("helper_threads_retired %d after_ms %d\n", n, (int)((now_s() - t0) * 1000));
        }
        return 0;
    }
    if (strcmp(mode, "churn16") == 0) {
        uint64_t before = stat_of("host.releases"), bytes_before = stat_of("host.released_bytes");
        enum { LIVE = 16 };
        char *live[LIVE] = {0};
        unsigned long long seed = 0x5EED;
        long steps = (long)arg;
        for (long i = 0; i < steps + LIVE; i++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            int slot = i < LIVE ? (int)i : (int)((seed >> 33) % LIVE);
            unsigned e = 20 + (unsigned)((seed >> 20) % 5); /* 1 MiB .. 32 MiB, log-uniform */
            size_t n = ((size_t)1 << e) + (size_t)((seed >> 40) % ((size_t)1 << e));
            free(live[slot]);
            live[slot] = malloc(n);
            touch(live[slot], n);
        }
        printf("releases %llu released_mb %llu\n", (unsigned long long)(stat_of("host.releases") - before),
               (unsigned long long)((stat_of("host.released_bytes") - bytes_before) / MB));
        for (int i = 0; i < LIVE; i++)
            free(live[i]);
        return 0;
    }
    if (strcmp(mode, "prompt") == 0) {
        int cycles = argc > 2 ? atoi(argv[2]) : 6;
        long gap_ms = argc > 3 ? atol(argv[3]) : 1000;
        long start = rss_mb();
        enum { BLOCKS = 40 };
        char *b[BLOCKS];
        printf("returned_mb");
        for (int c = 0; c < cycles; c++) {
            uint64_t before = stat_of("host.released_bytes");
            for (int i = 0; i < BLOCKS; i++) {
                b[i] = malloc(4 * MB);
                touch(b[i], 4 * MB);
            }
            for (int i = 0; i < BLOCKS; i++)
                free(b[i]);
            struct timespec ts = {gap_ms / 1000, (gap_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
            printf(" %llu", (unsigned long long)((stat_of("host.released_bytes") - before) / MB));
        }
        printf("\nhold_ms %llu\n", (unsigned long long)stat_of("host.release.hold_ms"));
        printf("settled_after_ms %ld\n", ms_until_settled(start));
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
    if (strcmp(mode, "tlsjoin") == 0) {
        void *h = argc > 2 ? dlopen(argv[2], RTLD_NOW) : NULL;
        tls_touch = h ? (void (*)(void))dlsym(h, "touch_tls") : NULL;
        if (!tls_touch) {
            fprintf(stderr, "p_release tlsjoin: %s\n", dlerror());
            return 2;
        }
        for (int round = 0; round < 4; round++) {
            pthread_t t[8];
            for (int i = 0; i < 8; i++)
                pthread_create(&t[i], NULL, tls_user, NULL);
            for (int i = 0; i < 8; i++)
                pthread_join(t[i], NULL);
        }
        printf("done\n");
        return 0;
    }
    if (strcmp(mode, "errno") == 0) {
        /* The process's first large block: the shim maps its table for it. */
        struct rlimit r = {(rlim_t)4 << 30, (rlim_t)4 << 30};
        setrlimit(RLIMIT_AS, &r);
        char *hole = mmap(NULL, 16 * MB, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        for (size_t sz = (size_t)1 << 30; sz >= 4096; sz >>= 1)
            while (mmap(NULL, sz, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) != MAP_FAILED)
                ;
        munmap(hole, MB);
        errno = 0;
        void *p = malloc(MB);
        int e = errno;
        printf("ok %d errno %d\n", p != NULL, e);
        return 0;
    }
    if (strcmp(mode, "twice") == 0) {
        uint64_t unmapped = 0, returned = 0, base = stat_of("host.released_bytes");
        for (int round = 0; round < (int)arg; round++) {
            free_burst(8);
            uint64_t before = stat_of("host.tcmalloc.pageheap_unmapped_bytes");
            size_t got[2] = {0, 0};
            pthread_t t[2];
            __atomic_store_n(&twice_go, 0, __ATOMIC_RELEASE);
            for (int i = 0; i < 2; i++)
                pthread_create(&t[i], NULL, twice_release, &got[i]);
            __atomic_store_n(&twice_go, 1, __ATOMIC_RELEASE);
            for (int i = 0; i < 2; i++)
                pthread_join(t[i], NULL);
            unmapped += stat_of("host.tcmalloc.pageheap_unmapped_bytes") - before;
            returned += got[0] + got[1];
        }
        printf("unmapped_mb %llu returned_mb %llu counted_mb %llu\n", (unsigned long long)(unmapped / MB),
               (unsigned long long)(returned / MB), (unsigned long long)((stat_of("host.released_bytes") - base) / MB));
        return 0;
    }
    if (strcmp(mode, "inherit") == 0) {
        setvbuf(stdout, NULL, _IOLBF, 0);
        free_burst(64);
        pid_t pid = fork();
        if (pid == 0) {
            long start = rss_mb();
            struct timespec quiet = {0, 150 * 1000000L}; /* a thread starts no sooner after a fork */
            nanosleep(&quiet, NULL);
            for (int i = 0; i < 300; i++)
                free(malloc(100));
            struct timespec ts = {(time_t)arg, 0};
            nanosleep(&ts, NULL);
            printf("child rss_start_mb %ld rss_end_mb %ld\n", start, rss_mb());
            _exit(0);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    }
    if (strcmp(mode, "forkkeep") == 0) {
        long start = rss_mb();
        free_burst(64);
        for (int ms = 0; ms < 2000 && helper_threads() == 0; ms += 5) {
            struct timespec ts = {0, 5 * 1000000L};
            nanosleep(&ts, NULL);
        }
        pid_t pid = fork();
        if (pid == 0)
            _exit(0);
        int threads = kernel_threads();
        long after_fork = rss_mb();
        int status = 0;
        waitpid(pid, &status, 0);
        struct timespec ts = {(time_t)arg, (long)((arg - (time_t)arg) * 1e9)};
        nanosleep(&ts, NULL);
        for (int i = 0; i < 1000; i++)
            free(malloc(64));
        long after = ms_until_settled(start);
        printf("threads_after_fork %d rss_start_mb %ld rss_after_fork_mb %ld settled_after_ms %ld\n", threads, start,
               after_fork, after);
        return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    }
    if (strcmp(mode, "steps") == 0 && argc > 4) {
        size_t live = (size_t)atol(argv[2]) * MB;
        int blocks = atoi(argv[3]) / 4, steps = atoi(argv[4]);
        char *keep = malloc(live);
        touch(keep, live);
        char **b = calloc((size_t)blocks, sizeof *b);
        double *ms = calloc((size_t)steps, sizeof *ms);
        uint64_t releases0 = stat_of("host.releases");
        for (int s = 0; s < steps; s++) {
            double t0 = now_s();
            for (int i = 0; i < blocks; i++) {
                b[i] = malloc(4 * MB);
                touch(b[i], 4 * MB);
            }
            for (int i = 0; i < blocks; i++)
                free(b[i]);
            ms[s] = (now_s() - t0) * 1000;
            struct timespec ts = {0, 20 * 1000000L};
            nanosleep(&ts, NULL);
        }
        for (int i = 1; i < steps; i++) /* insertion sort: a median */
            for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) {
                double t = ms[j];
                ms[j] = ms[j - 1];
                ms[j - 1] = t;
            }
        printf("step_ms_median %.2f pressure_mb %llu releases %llu\n", ms[steps / 2],
               (unsigned long long)(stat_of("host.release.pressure_bytes") / MB),
               (unsigned long long)(stat_of("host.releases") - releases0));
        free(keep);
        return 0;
    }
    if (strcmp(mode, "apierrno") == 0) {
        size_t (*json)(char *, size_t) = (size_t(*)(char *, size_t))dlsym(RTLD_DEFAULT, "forgealloc_stats_json");
        int (*write_to)(int, const char *) = (int (*)(int, const char *))dlsym(RTLD_DEFAULT, "forgealloc_stats_write");
        int (*stat)(const char *, uint64_t *) = (int (*)(const char *, uint64_t *))dlsym(RTLD_DEFAULT, "forgealloc_stat");
        if (!json || !write_to || !stat)
            return 2;
        static char doc[1 << 16];
        uint64_t v;
        int kept = 0;
        errno = 1234;
        json(doc, sizeof doc);
        kept += errno == 1234;
        errno = 1234;
        stat("host.calls.malloc", &v);
        kept += errno == 1234;
        int null = open("/dev/null", O_WRONLY);
        errno = 1234;
        write_to(null, "json");
        kept += errno == 1234;
        errno = 1234;
        malloc_stats();
        kept += errno == 1234;
        printf("errno kept %d of 4\n", kept);
        return 0;
    }
    if (strcmp(mode, "intro") == 0)
        return intro() ? 1 : 0;
    fprintf(stderr, "usage: p_release burst|fork|calls|hold|need|realloc|grow|forkrel|threads|retire|churn16|prompt|"
                    "churn|tlsjoin|errno|twice|inherit|apierrno|intro (see the comment at the top)\n");
    return 2;
}
