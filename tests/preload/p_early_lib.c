/* p_early_lib.c - a library whose constructor calls malloc_stats before
 * main, as a library loaded ahead of forgealloc's own constructor can:
 * the report must be printed then too (glibc's malloc_stats prints its
 * arena figures at any time). */
#include <malloc.h>
#include <stdio.h>

__attribute__((constructor)) static void early(void)
{
    fputs("p_early: constructor\n", stderr);
    malloc_stats();
}
