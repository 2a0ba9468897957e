/* p_large.c - large allocations for the report tests: allocates each size
 * given on the command line (with K/M suffix) by malloc, calloc and
 * operator-new-free C paths, touching nothing, and frees it; with --sized
 * first, frees with C23's free_sized (where the process has one). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *volatile sink;

/* Not in glibc 2.36: the preloaded library's, or none. */
extern void free_sized(void *p, size_t size) __attribute__((weak));

int main(int argc, char **argv)
{
    int sized = argc > 1 && strcmp(argv[1], "--sized") == 0;
    for (int i = 1 + sized; i < argc; i++) {
        char *end;
        size_t n = strtoull(argv[i], &end, 10);
        if (*end == 'K')
            n <<= 10;
        else if (*end == 'M')
            n <<= 20;
        sink = malloc(n);
        if (sized && free_sized)
            free_sized(sink, n);
        else
            free(sink);
    }
    return 0;
}
