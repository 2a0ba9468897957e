/* p_early.c - linked to p_early_lib, whose constructor calls malloc_stats
 * before main runs. */
#include <stdio.h>

int main(void)
{
    fputs("p_early: main\n", stderr);
    return 0;
}
