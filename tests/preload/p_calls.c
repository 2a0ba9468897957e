/* p_calls.c - known numbers of malloc-family calls, for exact comparison
 * with the stats dump.  Run twice (N=0 and N>0) by run.py: the difference
 * in every host.calls.* counter must be exactly what this program did.
 *
 *   p_calls calls N      N of each allocating function, each freed
 *   p_calls threads N    4 threads x N/4 malloc+free
 *   p_calls fork A B     A malloc+free, fork, the child B malloc+free
 *   p_calls handoff N    a thread that made small calls first frees N large
 *                        blocks (half of them grown by realloc into mappings
 *                        of their own) the main thread allocated later
 *   p_calls print TEXT   TEXT left in stdout's buffer for exit to flush
 *   p_calls print-null TEXT   the same, then an atexit handler closes
 *                        stdout and sets it to NULL
 *   p_calls print-swap TEXT   TEXT to the real stdout, then stdout pointed
 *                        at a stream that is closed and its memory reused */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* volatile: keep the compiler from pairing and removing malloc/free */
static void *volatile sink;

static void calls(long n)
{
    for (long i = 0; i < n; i++) {
        sink = malloc(32);
        free(sink);
        sink = malloc(5); /* below 16 bytes: counted apart from the fast path */
        free(sink);
        sink = calloc(4, 16);
        free(sink);
        sink = calloc(3, 2);
        free(sink);
        sink = realloc(NULL, 24);
        sink = realloc(sink, 4000);
        free(sink);
        sink = reallocarray(NULL, 8, 8);
        free(sink);
        sink = memalign(64, 100);
        free(sink);
        void *p = NULL;
        if (posix_memalign(&p, 128, 100) != 0)
            abort();
        free(p);
        sink = aligned_alloc(256, 512);
        free(sink);
        sink = valloc(10);
        free(sink);
        sink = pvalloc(10);
        free(sink);
        /* Refused alignments: counted as calls, with no bytes requested. */
        if (posix_memalign(&p, 3, 1 << 20) != EINVAL || memalign(SIZE_MAX, 1 << 20) != NULL ||
            aligned_alloc(SIZE_MAX, 1 << 20) != NULL)
            abort();
    }
}

static long per_thread;
static void *worker(void *arg)
{
    (void)arg;
    for (long i = 0; i < per_thread; i++) {
        sink = malloc((size_t)(i % 512) + 1);
        free(sink);
    }
    return NULL;
}

/* The blocks main hands to the waiting thread, one at a time. */
static pthread_mutex_t hand_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hand_cond = PTHREAD_COND_INITIALIZER;
static void *hand;
static int hand_small_done;

static void *take_and_free(void *arg)
{
    long n = (long)arg;
    for (int i = 0; i < 100; i++) { /* small calls first, before any large block exists */
        sink = malloc(64);
        free(sink);
    }
    pthread_mutex_lock(&hand_lock);
    hand_small_done = 1;
    pthread_cond_broadcast(&hand_cond);
    for (long i = 0; i < n; i++) {
        while (!hand)
            pthread_cond_wait(&hand_cond, &hand_lock);
        free(hand);
        hand = NULL;
        pthread_cond_broadcast(&hand_cond);
    }
    pthread_mutex_unlock(&hand_lock);
    return NULL;
}

static int handoff(long n)
{
    pthread_t t;
    if (pthread_create(&t, NULL, take_and_free, (void *)n))
        return 1;
    pthread_mutex_lock(&hand_lock);
    while (!hand_small_done)
        pthread_cond_wait(&hand_cond, &hand_lock);
    for (long i = 0; i < n; i++) {
        pthread_mutex_unlock(&hand_lock);
        char *p = malloc(1 << 20);
        if (p && (i & 1))
            p = realloc(p, 8 << 20); /* grown past 4 MiB: a mapping of its own, not tcmalloc's */
        if (!p)
            abort();
        memset(p, 1, 1 << 20);
        pthread_mutex_lock(&hand_lock);
        hand = p;
        pthread_cond_broadcast(&hand_cond);
        while (hand)
            pthread_cond_wait(&hand_cond, &hand_lock);
    }
    pthread_mutex_unlock(&hand_lock);
    return pthread_join(t, NULL) != 0;
}

static void close_stdout(void)
{
    fclose(stdout);
    stdout = NULL;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "calls") == 0) {
        calls(atol(argv[2]));
    } else if (argc >= 3 && strcmp(argv[1], "threads") == 0) {
        per_thread = atol(argv[2]) / 4;
        pthread_t t[4];
        for (int i = 0; i < 4; i++)
            pthread_create(&t[i], NULL, worker, NULL);
        for (int i = 0; i < 4; i++)
            pthread_join(t[i], NULL);
    } else if (argc >= 4 && strcmp(argv[1], "fork") == 0) {
        per_thread = atol(argv[2]);
        worker(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            per_thread = atol(argv[3]);
            worker(NULL);
            exit(0); /* exit, not _exit: the child writes its own dump */
        }
        int st;
        waitpid(pid, &st, 0);
        return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
    } else if (argc >= 3 && strcmp(argv[1], "handoff") == 0) {
        return handoff(atol(argv[2]));
    } else if (argc >= 3 && strcmp(argv[1], "print") == 0) {
        printf("%s\n", argv[2]); /* left in stdout's buffer for exit to flush */
    } else if (argc >= 3 && strcmp(argv[1], "print-null") == 0) {
        printf("%s\n", argv[2]);
        atexit(close_stdout);
    } else if (argc >= 3 && strcmp(argv[1], "print-swap") == 0) {
        printf("%s\n", argv[2]);
        fflush(stdout);
        FILE *other = fopen("/dev/null", "w");
        if (!other)
            return 1;
        stdout = other;
        printf("to /dev/null\n");
        fclose(other);
        for (int i = 0; i < 64; i++) /* the freed FILE's memory, taken again and scribbled on */
            memset(malloc(sizeof(FILE)), 0xa5, sizeof(FILE));
    } else {
        fprintf(stderr, "usage: p_calls calls N | threads N | fork A B | handoff N | print[-null|-swap] TEXT\n");
        return 2;
    }
    return 0;
}
