/* p_tcprop_lib.c - a preloaded library that counts the reads of tcmalloc's
 * numbers that walk all of its caches under their locks (those of
 * "generic.current_allocated_bytes"), and passes every read on.  At exit
 * it writes "tcprop walks N" to stderr.  Preloaded beside the shim, it
 * comes before libtcmalloc_minimal in the lookup scope, so the shim's
 * reads reach it (preload.tc_reads_paced). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define WRAP __attribute__((visibility("default")))

static unsigned long walks;

WRAP int MallocExtension_GetNumericProperty(const char *name, size_t *value)
{
    static int (*real)(const char *, size_t *);
    if (!real)
        real = (int (*)(const char *, size_t *))dlsym(RTLD_NEXT, "MallocExtension_GetNumericProperty");
    if (strcmp(name, "generic.current_allocated_bytes") == 0)
        __atomic_add_fetch(&walks, 1, __ATOMIC_RELAXED);
    return real ? real(name, value) : 0;
}

__attribute__((destructor)) static void report(void)
{
    char line[64];
    int n = snprintf(line, sizeof line, "tcprop walks %lu\n", __atomic_load_n(&walks, __ATOMIC_RELAXED));
    if (write(2, line, (size_t)n) < 0)
        return;
}
