/* p_secure.c - linked against libforgealloc.so (DT_NEEDED, not preloaded:
 * the loader ignores LD_PRELOAD in setuid programs).  run.py makes a
 * setuid-root copy and runs it as an unprivileged user, so the process is
 * AT_SECURE: the shim must take no file path from the environment. */
#include <stdlib.h>
#include <time.h>

static void *volatile sink;

int main(void)
{
    for (int i = 0; i < 100; i++) {
        sink = malloc(100);
        free(sink);
    }
    /* Long enough for periodic dumps (FORGEALLOC_STATS_INTERVAL=0.1) to come, were there any. */
    struct timespec ts = {0, 500 * 1000 * 1000L};
    nanosleep(&ts, NULL);
    return 0;
}
