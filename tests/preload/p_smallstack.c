/* p_smallstack.c - large allocations on a thread with little stack left.
 *
 *   p_smallstack STACK USED
 *
 * Starts a thread with a STACK-byte stack, takes USED bytes of it, then
 * makes large mallocs, callocs and reallocs (1-30 MiB) and frees them.
 * Prints "ok" when it gets through; an allocator that needs more stack than
 * is left kills it with SIGSEGV. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t used;

static void *work(void *arg)
{
    (void)arg;
    char *taken = __builtin_alloca(used);
    memset(taken, 0, used);
    __asm__ volatile("" : : "r"(taken) : "memory");
    for (size_t i = 1; i <= 30; i++) {
        char *p = malloc(i << 20), *c = calloc(1, i << 20);
        if (!p || !c)
            return (void *)1;
        memset(p, 1, 4096);
        char *q = realloc(p, (i + 40) << 20);
        if (!q || c[(i << 20) - 1])
            return (void *)1;
        free(q);
        free(c);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: p_smallstack STACK USED\n");
        return 2;
    }
    used = strtoul(argv[2], NULL, 0);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    if (pthread_attr_setstacksize(&attr, strtoul(argv[1], NULL, 0)) != 0)
        return 2;
    for (int round = 0; round < 3; round++) {
        pthread_t t;
        void *r;
        if (pthread_create(&t, &attr, work, NULL) != 0 || pthread_join(t, &r) != 0 || r)
            return 1;
    }
    puts("ok");
    return 0;
}
