/* p_lookup_lib.c - a preloaded library that wraps libc functions the usual
 * way, finding the next definition with dlvsym(RTLD_NEXT) (write: glibc's)
 * or dlsym(RTLD_NEXT) (malloc_trim: forgealloc's when forgealloc comes
 * after this library in LD_PRELOAD, glibc's when before).  Its wrappers
 * carry glibc's version (p_lookup_lib.map).  lookup_lib_find and
 * lookup_lib_libc let p_lookup see where lookups made from this library
 * land.  Built with -fno-optimize-sibling-calls: each dlsym here is called
 * from here. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <stddef.h>
#include <unistd.h>

#define WRAP __attribute__((visibility("default")))

static int write_calls, trim_calls;

WRAP ssize_t write(int fd, const void *buf, size_t n)
{
    static ssize_t (*real)(int, const void *, size_t);
    if (!real)
        real = (ssize_t(*)(int, const void *, size_t))dlvsym(RTLD_NEXT, "write", "GLIBC_2.2.5");
    __atomic_add_fetch(&write_calls, 1, __ATOMIC_RELAXED);
    return real(fd, buf, n);
}

WRAP int malloc_trim(size_t pad)
{
    static int (*real)(size_t);
    if (!real)
        real = (int (*)(size_t))dlsym(RTLD_NEXT, "malloc_trim");
    __atomic_add_fetch(&trim_calls, 1, __ATOMIC_RELAXED);
    return real(pad);
}

WRAP int lookup_lib_calls(const char *which) { return which[0] == 'w' ? write_calls : trim_calls; }

typedef void *(*sym_fn)(void *, const char *);
typedef void *(*vsym_fn)(void *, const char *, const char *);

/* glibc's own dlsym and dlvsym (in libdl.so.2 before glibc 2.34): what a
 * lookup made with them answers is what it would without the shim. */
WRAP void lookup_lib_glibc(sym_fn *sym, vsym_fn *vsym)
{
    static const char *const names[] = {"libc.so.6", "libdl.so.2"};
    *sym = NULL;
    *vsym = NULL;
    for (int i = 0; i < 2 && !*sym; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_NOLOAD);
        if (!h)
            continue;
        *sym = (sym_fn)dlsym(h, "dlsym");
        *vsym = (vsym_fn)dlsym(h, "dlvsym");
        dlclose(h);
    }
}

/* handle, name (at version, if given) looked up from here: with the
 * dlsym and dlvsym the program's calls bind to, or with glibc's. */
WRAP void *lookup_lib_find(void *handle, const char *name, const char *version, int glibc)
{
    sym_fn sym = dlsym;
    vsym_fn vsym = dlvsym;
    if (glibc)
        lookup_lib_glibc(&sym, &vsym);
    void *f = version ? vsym(handle, name, version) : sym(handle, name);
    return f;
}

/* name looked up from here through a handle on libc. */
WRAP void *lookup_lib_libc(const char *name)
{
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    void *f = libc ? dlsym(libc, name) : NULL;
    if (libc)
        dlclose(libc);
    return f;
}
