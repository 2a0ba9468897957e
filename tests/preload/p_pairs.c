/* p_pairs.c - THREADS threads each make PAIRS malloc+free pairs of 16 to
 * 271 bytes as fast as they can, then the program prints "ms N", the
 * milliseconds the threads took.
 *
 * usage: p_pairs THREADS PAIRS */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long pairs;

static void *work(void *arg)
{
    (void)arg;
    void *volatile keep;
    for (long i = 0; i < pairs; i++) {
        keep = malloc(16 + (size_t)(i & 255));
        free(keep);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    int threads = atoi(argv[1]);
    pairs = atol(argv[2]);
    if (threads < 1 || threads > 64 || pairs < 1)
        return 2;
    pthread_t t[64];
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < threads; i++)
        if (pthread_create(&t[i], NULL, work, NULL))
            return 1;
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("ms %ld\n", (long)((b.tv_sec - a.tv_sec) * 1000 + (b.tv_nsec - a.tv_nsec) / 1000000));
    return 0;
}
