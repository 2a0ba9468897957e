/* query.c - forgealloc-query: asks the libforgealloc.so preloaded into it.
 *
 * `forgealloc version` and `doctor` run it as `LD_PRELOAD=<lib>
 * forgealloc-query WHAT`, so they read the state of the very library a
 * program would get, not a copy compiled in here.  It is not linked to
 * the library: it finds the public API with dlsym.
 * `forgealloc-query served`, run with the caller's own environment, says
 * who serves malloc there (forgealloc or what came before it). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdbool.h>
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

static int collect(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    const char **names = arg;
    for (int i = 0; i < 255; i++)
        if (!names[i]) {
            names[i] = info->dlpi_name ? info->dlpi_name : "";
            break;
        }
    return 0;
}

/* The first object in the loader's order that defines malloc itself (as
 * the library's own search, src/host/served.c). */
static const char *first_definer(void)
{
    static const char *names[256];
    dl_iterate_phdr(collect, names);
    for (int i = 1; i < 256 && names[i]; i++) {
        if (!strchr(names[i], '/'))
            continue; /* the vDSO */
        void *h = dlopen(names[i], RTLD_LAZY | RTLD_NOLOAD);
        if (!h)
            continue;
        Dl_info info;
        void *a = dlsym(h, "malloc");
        int own = a && dladdr(a, &info) && info.dli_fname && strcmp(info.dli_fname, names[i]) == 0;
        dlclose(h);
        if (own)
            return names[i];
    }
    return "unknown";
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
    if (strcmp(what, "served") == 0) {
        /* Who serves malloc in a process started with this environment
         * (run without forcing LD_PRELOAD): the library answers when it is
         * loaded; otherwise the same search it makes is made here. */
        typedef const char *(*served_fn)(void);
        served_fn served = (served_fn)dlsym(RTLD_DEFAULT, "forgealloc_malloc_served_by");
        uint64_t interposed = 0;
        stat_fn stat = (stat_fn)dlsym(RTLD_DEFAULT, "forgealloc_stat");
        if (served && stat && stat("host.interposed", &interposed) == 0) {
            printf("forgealloc loaded\nserved_by %s\ninterposed %s\n", served(), interposed ? "yes" : "no");
        } else {
            printf("forgealloc absent\nserved_by %s\ninterposed no\n", first_definer());
        }
        return 0;
    }
    bool help = strcmp(what, "-h") == 0 || strcmp(what, "--help") == 0;
    fprintf(help ? stdout : stderr, "usage: forgealloc-query version|options|stats [FORMAT]|check|served\n"
                                    "(version, options, stats and check need LD_PRELOAD=libforgealloc.so)\n");
    return help ? 0 : 2;
}
