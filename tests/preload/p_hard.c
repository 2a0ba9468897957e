/* p_hard.c - the shim under stress: fork storms, thread churn, cross-thread
 * frees, signals landing inside malloc, and every way a process ends.
 *
 *   p_hard forkstorm N      3 threads allocate without pause while main forks
 *                           N children; each child allocates, then ends with
 *                           exit() (even) or _exit() (odd)
 *   p_hard threads N M      N short-lived threads in sequence, then N in
 *                           batches of 64, M mallocs each: exact counts,
 *                           few per-thread records
 *   p_hard crossfree N      2 producers, 2 consumers, N blocks with contents
 *                           checked by the thread that frees them
 *   p_hard hammer           threads allocate until a signal ends the process
 *   p_hard end HOW          exit | return | _exit | abort, after some work */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void *volatile sink;
static volatile int stop;

static uint64_t stat_of(const char *key)
{
    int (*fn)(const char *, uint64_t *) = (int (*)(const char *, uint64_t *))dlsym(RTLD_DEFAULT, "forgealloc_stat");
    uint64_t v = 0;
    if (!fn || fn(key, &v) != 0) {
        fprintf(stderr, "p_hard: no stat %s\n", key);
        exit(1);
    }
    return v;
}

static unsigned next(unsigned *s) { return *s = *s * 1103515245u + 12345u; }

static void *allocate_forever(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    void *keep[64] = {0};
    while (!stop) {
        int i = (int)(next(&seed) >> 8) % 64;
        free(keep[i]);
        keep[i] = malloc((next(&seed) >> 8) % 70000 + 1);
    }
    for (int i = 0; i < 64; i++)
        free(keep[i]);
    return NULL;
}

static int forkstorm(int n)
{
    pthread_t t[3];
    for (int i = 0; i < 3; i++)
        pthread_create(&t[i], NULL, allocate_forever, (void *)(uintptr_t)(i + 1));
    int bad = 0;
    for (int i = 0; i < n; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            alarm(20); /* a deadlock in the child ends as SIGALRM, not a hang */
            for (int k = 0; k < 100; k++) {
                sink = malloc((size_t)k * 100 + 1);
                free(sink);
            }
            if (i % 2)
                _exit(0);
            exit(0);
        }
        int st;
        if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "p_hard: child %d ended badly (status %d)\n", i, st);
            bad++;
        }
    }
    stop = 1;
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    return bad;
}

static long per_thread;
static void *mallocs(void *arg)
{
    (void)arg;
    for (long i = 0; i < per_thread; i++) {
        sink = malloc(64);
        free(sink);
    }
    return NULL;
}

static int threads(int n, long m)
{
    per_thread = m;
    uint64_t before = stat_of("host.calls.malloc");
    pthread_t t[64];
    for (int i = 0; i < n; i++) {
        pthread_create(&t[0], NULL, mallocs, NULL);
        pthread_join(t[0], NULL);
    }
    for (int i = 0; i < n; i += 64) {
        int k = n - i < 64 ? n - i : 64;
        for (int j = 0; j < k; j++)
            pthread_create(&t[j], NULL, mallocs, NULL);
        for (int j = 0; j < k; j++)
            pthread_join(t[j], NULL);
    }
    uint64_t got = stat_of("host.calls.malloc") - before, want = 2 * (uint64_t)n * (uint64_t)m;
    uint64_t records = stat_of("host.thread_records");
    printf("mallocs %llu expected %llu records %llu\n", (unsigned long long)got, (unsigned long long)want,
           (unsigned long long)records);
    /* Exact: glibc's thread start-up uses calloc and mmap, not malloc.
     * Records stay bounded by the threads alive at once. */
    return got != want || records > 70;
}

/* Detached threads that never allocate: as each ends, glibc frees other
 * ended threads' TLS on it (ld.so's free, after the thread's key
 * destructors ran).  Counting that must not take a record the thread never
 * hands back: records stay bounded by the threads alive at once. */
static int ended;
static void *idle(void *arg)
{
    (void)arg;
    struct timespec ts = {0, 2000000L};
    nanosleep(&ts, NULL);
    __atomic_add_fetch(&ended, 1, __ATOMIC_RELEASE);
    return NULL;
}

static int detached(int rounds)
{
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < 50; i++) {
            pthread_t t;
            pthread_create(&t, &a, idle, NULL);
        }
        while (__atomic_load_n(&ended, __ATOMIC_ACQUIRE) < 50 * (r + 1))
            sched_yield();
        struct timespec ts = {0, 20000000L}; /* their teardown after the function returned */
        nanosleep(&ts, NULL);
    }
    uint64_t records = stat_of("host.thread_records");
    printf("detached threads %d records %llu\n", 50 * rounds, (unsigned long long)records);
    return records > 60;
}

/* Producer/consumer ring of blocks tagged by their producer. */
#define RING 4096
static void *ring[RING];
static unsigned long head, tail;
static long remaining_to_make, bad_blocks;
static pthread_mutex_t ring_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ring_cond = PTHREAD_COND_INITIALIZER;

static void *producer(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    for (;;) {
        size_t n = (next(&seed) >> 8) % 2000 + 16;
        unsigned char *p = malloc(n);
        memset(p, (int)(n & 0xff), n);
        memcpy(p, &n, sizeof n);
        pthread_mutex_lock(&ring_lock);
        while (head - tail == RING && remaining_to_make > 0)
            pthread_cond_wait(&ring_cond, &ring_lock);
        if (remaining_to_make <= 0) {
            pthread_mutex_unlock(&ring_lock);
            free(p);
            return NULL;
        }
        remaining_to_make--;
        ring[head++ % RING] = p;
        pthread_cond_broadcast(&ring_cond);
        pthread_mutex_unlock(&ring_lock);
    }
}

static void *consumer(void *arg)
{
    (void)arg;
    long bad = 0;
    for (;;) {
        pthread_mutex_lock(&ring_lock);
        while (head == tail && remaining_to_make > 0)
            pthread_cond_wait(&ring_cond, &ring_lock);
        if (head == tail) {
            pthread_mutex_unlock(&ring_lock);
            break;
        }
        unsigned char *p = ring[tail++ % RING];
        pthread_cond_broadcast(&ring_cond);
        pthread_mutex_unlock(&ring_lock);
        size_t n;
        memcpy(&n, p, sizeof n);
        for (size_t i = sizeof n; i < n; i += 7)
            bad += p[i] != (unsigned char)(n & 0xff);
        free(p);
    }
    __atomic_fetch_add(&bad_blocks, bad, __ATOMIC_RELAXED);
    return NULL;
}

static int crossfree(long n)
{
    remaining_to_make = n;
    pthread_t p[2], c[2];
    for (int i = 0; i < 2; i++) {
        pthread_create(&p[i], NULL, producer, (void *)(uintptr_t)(i + 7));
        pthread_create(&c[i], NULL, consumer, NULL);
    }
    for (int i = 0; i < 2; i++)
        pthread_join(p[i], NULL);
    pthread_mutex_lock(&ring_lock);
    pthread_cond_broadcast(&ring_cond);
    pthread_mutex_unlock(&ring_lock);
    for (int i = 0; i < 2; i++)
        pthread_join(c[i], NULL);
    printf("blocks %ld corrupted bytes %ld\n", n, bad_blocks);
    return bad_blocks != 0;
}

static int hammer(void)
{
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, allocate_forever, (void *)(uintptr_t)(i + 11));
    printf("ready\n");
    fflush(stdout);
    allocate_forever((void *)13); /* the main thread too: signals land anywhere */
    return 0;
}

static int end(const char *how)
{
    for (int k = 0; k < 1000; k++) {
        sink = malloc(128);
        free(sink);
    }
    if (strcmp(how, "exit") == 0)
        exit(0);
    if (strcmp(how, "_exit") == 0)
        _exit(0);
    if (strcmp(how, "abort") == 0)
        abort();
    return 0; /* "return" */
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "forkstorm") == 0 && argc > 2)
        return forkstorm(atoi(argv[2])) ? 1 : 0;
    if (strcmp(mode, "threads") == 0 && argc > 3)
        return threads(atoi(argv[2]), atol(argv[3])) ? 1 : 0;
    if (strcmp(mode, "detached") == 0 && argc > 2)
        return detached(atoi(argv[2])) ? 1 : 0;
    if (strcmp(mode, "crossfree") == 0 && argc > 2)
        return crossfree(atol(argv[2])) ? 1 : 0;
    if (strcmp(mode, "hammer") == 0)
        return hammer();
    if (strcmp(mode, "end") == 0 && argc > 2)
        return end(argv[2]);
    fprintf(stderr, "usage: p_hard forkstorm N | threads N M | detached ROUNDS | crossfree N | hammer | end HOW\n");
    return 2;
}
