/* query.c - forgealloc-query: asks the libforgealloc.so preloaded into it.
 *
 * scripts/forgealloc runs it as `LD_PRELOAD=<lib> forgealloc-query WHAT`,
 * so `forgealloc env` and `doctor` read the option table and the state of
 * the very library a program would get, not a copy compiled in here.  It
 * is not linked to the library: it finds the public API with dlsym. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef const char *(*version_fn)(void);
typedef size_t (*json_fn)(char *, size_t);
typedef int (*write_fn)(int, const char *);
typedef int (*stat_fn)(const char *, uint64_t *);
typedef int (*ownership_fn)(const void *);

static void *need(const char *name)
{
    void *f = dlsym(RTLD_DEFAULT, name);
    if (!f) {
        fprintf(stderr, "forgealloc-query: libforgealloc.so is not loaded (run it with LD_PRELOAD=/path/to/libforgealloc.so)\n");
        exit(3);
    }
    return f;
}

static int print_json(const char *name)
{
    json_fn f = (json_fn)need(name);
    size_t cap = 1 << 16;
    for (;;) {
        char *buf = malloc(cap);
        if (!buf)
            return 1;
        size_t n = f(buf, cap);
        if (n < cap) {
            fwrite(buf, 1, n, stdout);
            free(buf);
            return 0;
        }
        free(buf);
        cap = n + 1;
    }
}

int main(int argc, char **argv)
{
    const char *what = argc > 1 ? argv[1] : "";
    if (strcmp(what, "version") == 0) {
        printf("%s\n", ((version_fn)need("forgealloc_version"))());
        return 0;
    }
    if (strcmp(what, "options") == 0)
        return print_json("forgealloc_options_json");
    if (strcmp(what, "stats") == 0) {
        fflush(stdout);
        return ((write_fn)need("forgealloc_stats_write"))(1, argc > 2 ? argv[2] : "json") == 0 ? 0 : 1;
    }
    if (strcmp(what, "check") == 0) {
        /* One "key value" line each, for `forgealloc doctor`. */
        printf("version %s\n", ((version_fn)need("forgealloc_version"))());
        void *p = malloc(100);
        ownership_fn own = (ownership_fn)dlsym(RTLD_DEFAULT, "MallocExtension_GetOwnership");
        printf("tcmalloc_owns_malloc %s\n", own && own(p) == 1 ? "yes" : "no");
        free(p);
        uint64_t calls = 0;
        ((stat_fn)need("forgealloc_stat"))("host.calls.malloc", &calls);
        printf("malloc_counted %s\n", calls > 0 ? "yes" : "no");
        return 0;
    }
    fprintf(stderr, "usage: LD_PRELOAD=libforgealloc.so forgealloc-query version|options|stats [FORMAT]|check\n");
    return 2;
}
