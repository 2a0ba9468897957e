/* p_early.c - linked to p_early_lib, whose constructor calls malloc_stats
 * and reallocarray before main runs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *p_early_block(void);

int main(void)
{
    fputs("p_early: main\n", stderr);
    char *block = p_early_block();
    if (!block || strcmp(block, "early") != 0) {
        fputs("p_early: the constructor's block is wrong\n", stderr);
        return 1;
    }
    free(block);
    return 0;
}
