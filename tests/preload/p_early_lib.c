/* p_early_lib.c - a library whose constructor runs before forgealloc's own,
 * as the program's libraries' do:
 *  - it calls malloc_stats: the report must be printed then too (glibc's
 *    malloc_stats prints its arena figures at any time);
 *  - it grows a block with reallocarray, which main frees: the block must
 *    come from the allocator that serves free, also when another allocator
 *    is preloaded ahead of forgealloc. */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *block;

__attribute__((visibility("default"))) char *p_early_block(void) { return block; }

__attribute__((constructor)) static void early(void)
{
    fputs("p_early: constructor\n", stderr);
    if (!getenv("P_EARLY_QUIET"))
        malloc_stats();
    block = reallocarray(NULL, 100, 16);
    if (block) {
        strcpy(block, "early");
        block = reallocarray(block, 4096, 16);
    }
}
