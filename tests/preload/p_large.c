/* p_large.c - large allocations for the report tests: allocates each size
 * given on the command line (with K/M suffix) by malloc, calloc and
 * operator-new-free C paths, touching nothing, and frees it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *volatile sink;

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        char *end;
        size_t n = strtoull(argv[i], &end, 10);
        if (*end == 'K')
            n <<= 10;
        else if (*end == 'M')
            n <<= 20;
        sink = malloc(n);
        free(sink);
    }
    return 0;
}
