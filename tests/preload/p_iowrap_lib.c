/* p_iowrap_lib.c - a preloaded library that wraps open and pread and
 * allocates inside each, as tracing, sandboxing and path-rewriting shims
 * do.  forgealloc reads /proc while tcmalloc holds
 * its page-heap lock: calling these wrappers there would wait for that
 * lock for ever. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#define WRAP __attribute__((visibility("default")))

static void touch_heap(const char *what)
{
    char *copy = strdup(what);
    free(copy);
}

WRAP int open(const char *path, int flags, ...)
{
    static int (*real)(const char *, int, ...);
    if (!real)
        real = (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, "open");
    touch_heap(path);
    va_list ap;
    va_start(ap, flags);
    int mode = va_arg(ap, int);
    va_end(ap);
    return real(path, flags, mode);
}
WRAP int open64(const char *path, int flags, ...) __attribute__((alias("open")));

WRAP ssize_t pread(int fd, void *buf, size_t n, off_t at)
{
    static ssize_t (*real)(int, void *, size_t, off_t);
    if (!real)
        real = (ssize_t(*)(int, void *, size_t, off_t))dlsym(RTLD_NEXT, "pread");
    touch_heap("pread");
    return real(fd, buf, n, at);
}
WRAP ssize_t pread64(int fd, void *buf, size_t n, off_t at) __attribute__((alias("pread")));
