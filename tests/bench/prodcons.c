/* prodcons.c - producer/consumer with cross-thread frees: a data-loader or
 * request thread allocates buffers that a worker thread consumes and frees,
 * so every block is freed by a thread other than the one that allocated it.
 *
 * One producer mallocs blocks (16 B - 4 KiB, log-uniform), writes them and
 * pushes them through a bounded single-producer/single-consumer lock-free
 * ring; one consumer reads and frees them.  Reports blocks per second.
 *
 * usage: prodcons BLOCKS */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>

#include "bench.h"

#define RING_SLOTS 1024 /* power of two */
#define SIZE_LO_LOG2 4  /* 16 B */
#define SIZE_HI_LOG2 12 /* sizes below 4 KiB */
#define SPINS_BEFORE_YIELD 64

struct ring {
    _Alignas(64) atomic_size_t head; /* next slot the producer writes */
    _Alignas(64) atomic_size_t tail; /* next slot the consumer reads */
    _Alignas(64) char *slot[RING_SLOTS];
};

static struct ring ring;
static long blocks;

/* Spin a little, then give the core away: the machine may have 2 cores. */
static void backoff(unsigned *spins)
{
    if (++*spins >= SPINS_BEFORE_YIELD) {
        *spins = 0;
        sched_yield();
    }
}

static void *producer(void *arg)
{
    (void)arg;
    uint64_t rng = BENCH_SEED;
    for (long i = 0; i < blocks; i++) {
        size_t n = bench_size(&rng, SIZE_LO_LOG2, SIZE_HI_LOG2);
        char *p = malloc(n);
        if (!p)
            abort();
        memset(p, (int)(i & 0xff), n < 64 ? n : 64);
        size_t head = atomic_load_explicit(&ring.head, memory_order_relaxed);
        unsigned spins = 0;
        while (head - atomic_load_explicit(&ring.tail, memory_order_acquire) == RING_SLOTS)
            backoff(&spins);
        ring.slot[head % RING_SLOTS] = p;
        atomic_store_explicit(&ring.head, head + 1, memory_order_release);
    }
    return NULL;
}

static void *consumer(void *arg)
{
    unsigned long *sum = arg;
    for (long i = 0; i < blocks; i++) {
        size_t tail = atomic_load_explicit(&ring.tail, memory_order_relaxed);
        unsigned spins = 0;
        while (atomic_load_explicit(&ring.head, memory_order_acquire) == tail)
            backoff(&spins);
        char *p = ring.slot[tail % RING_SLOTS];
        atomic_store_explicit(&ring.tail, tail + 1, memory_order_release);
        *sum += (unsigned char)p[0];
        free(p);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    blocks = bench_arg(argc, argv, 1, "BLOCKS");
    unsigned long sum = 0;
    pthread_t prod, cons;

    double t0 = bench_now();
    if (pthread_create(&cons, NULL, consumer, &sum) || pthread_create(&prod, NULL, producer, NULL))
        abort();
    pthread_join(prod, NULL);
    pthread_join(cons, NULL);
    double secs = bench_now() - t0;

    printf("{\"ops\": %ld, \"ops_per_s\": %.0f, \"checksum\": %lu}\n", blocks, (double)blocks / secs,
           sum);
    return 0;
}
