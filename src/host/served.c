/* served.c - who serves malloc for the process (see served.h).
 *
 * The dynamic loader binds every malloc call of the process to the first
 * definition in its global lookup order: the program, LD_PRELOAD entries,
 * /etc/ld.so.preload, then the libraries.  dlsym with RTLD_DEFAULT follows
 * the same order, and dladdr names the object. */
#define _GNU_SOURCE
#include "served.h"

#include <dlfcn.h>
#include <link.h>
#include <gperftools/tcmalloc.h>
#include <string.h>
#include <unistd.h>

#include "../core/fmt.h"
#include "../core/log.h"

extern char **environ;

/* The preload order is LD_PRELOAD's: a child started with the same one
 * under a parent that printed the line keeps quiet (fa_warn_tree). */
static const char *const preload_names[] = {"LD_PRELOAD"};

static enum fa_malloc_server server = FA_SERVER_SELF;
static char served_path[1024];

static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* The object that defines `addr`, into out; false if none is known. */
static bool object_of(void *addr, char *out, size_t cap, void **base)
{
    Dl_info info;
    if (!addr || !dladdr(addr, &info) || !info.dli_fbase)
        return false;
    *base = info.dli_fbase;
    const char *name = info.dli_fname ? info.dli_fname : "";
    if (name[0] == '\0') { /* the main program */
        ssize_t n = readlink("/proc/self/exe", out, cap - 1);
        out[n > 0 ? n : 0] = '\0';
        return true;
    }
    size_t n = strlen(name);
    if (n >= cap)
        n = cap - 1;
    memcpy(out, name, n);
    out[n] = '\0';
    return true;
}

#define MAX_OBJECTS 128
struct objects {
    int n;
    const char *name[MAX_OBJECTS]; /* the loader's own strings: they live as long as the object */
};

static int collect(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    struct objects *o = arg;
    if (o->n < MAX_OBJECTS)
        o->name[o->n++] = info->dlpi_name ? info->dlpi_name : "";
    return 0;
}

/* The first object in the loader's order (the program, LD_PRELOAD,
 * /etc/ld.so.preload, then libraries) that defines malloc itself. */
static void *first_definer(bool *program)
{
    void *addr = dlsym(RTLD_DEFAULT, "malloc");
    Dl_info info;
    struct link_map *map = NULL;
    if (!addr || !dladdr1(addr, &info, (void **)&map, RTLD_DL_LINKMAP) || !map || map->l_prev)
        return addr; /* a library's own definition (the program is first in the loader's list) */
    const ElfW(Sym) *sym = NULL;
    if (dladdr1(addr, &info, (void **)&sym, RTLD_DL_SYMENT) && sym && sym->st_shndx != SHN_UNDEF &&
        info.dli_saddr == addr && info.dli_sname && strcmp(info.dli_sname, "malloc") == 0)
    {
        *program = true;
        return addr; /* the program defines malloc itself */
    }
    /* A PLT stub of the program: one built without PIE that takes
     * malloc's address (python3) makes its stub the canonical address.
     * Walk the loader's list up to our own object.  dlopen(RTLD_NOLOAD)
     * of a library preloaded ahead of us may run its constructor a little
     * earlier than the loader would; only misordered preloads get there. */
    Dl_info self;
    if (!dladdr((void *)fa_host_served_check, &self) || !self.dli_fname)
        return addr;
    struct objects o = {0};
    dl_iterate_phdr(collect, &o);
    for (int i = 1; i < o.n; i++) { /* 0 is the program */
        if (strcmp(o.name[i], self.dli_fname) == 0)
            return (void *)fa_host_served_check; /* ours comes first */
        if (!strchr(o.name[i], '/'))
            continue; /* the vDSO; loaded libraries carry the path they were found at */
        void *h = dlopen(o.name[i], RTLD_LAZY | RTLD_NOLOAD);
        if (!h)
            continue;
        void *a = dlsym(h, "malloc"); /* searches the object first, then its dependencies */
        bool own = a && dladdr(a, &info) && info.dli_fname && strcmp(info.dli_fname, o.name[i]) == 0;
        dlclose(h);
        if (own)
            return a;
    }
    return addr;
}

void fa_host_served_check(void)
{
    char ours[1024], tc[1024], found[1024];
    void *ours_base = NULL, *tc_base = NULL, *found_base = NULL;
    bool program = false;
    if (!object_of((void *)fa_host_served_check, ours, sizeof ours, &ours_base) ||
        !object_of(first_definer(&program), found, sizeof found, &found_base))
        return; /* cannot tell: assume ours, say nothing */
    /* tc_malloc as our calls reach it: the loader binds it like malloc, so
     * a tcmalloc ahead of us (any soname) is the one we call as well. */
    bool tc_known = object_of((void *)&tc_malloc, tc, sizeof tc, &tc_base);
    memcpy(served_path, found, strlen(found) + 1);
    if (found_base == ours_base) {
        __atomic_store_n(&server, FA_SERVER_SELF, __ATOMIC_RELEASE);
        return;
    }
    const char *name = base_name(found);
    if (tc_known && found_base == tc_base) {
        __atomic_store_n(&server, FA_SERVER_SAME_TCMALLOC, __ATOMIC_RELEASE);
        fa_warn_tree(environ, preload_names, 1,
                     "malloc is served by %s, which comes before libforgealloc.so in the preload order: forgealloc "
                     "counts no call (the tcmalloc numbers it reports are the process's); put libforgealloc.so "
                     "first in LD_PRELOAD or remove %s from it (forgealloc run does both)",
                     found, name);
        return;
    }
    __atomic_store_n(&server, FA_SERVER_OTHER, __ATOMIC_RELEASE);
    if (program)
        return; /* an allocator linked into the program: nothing to fix; the dump says it */
    if (strncmp(name, "libc.so", 7) == 0)
        fa_warn("malloc is served by %s: libforgealloc.so was loaded after the program started (dlopen) and "
                "serves nothing; preload it instead: LD_PRELOAD=%s (or forgealloc run)",
                found, ours);
    else
        fa_warn_tree(environ, preload_names, 1,
                     "malloc is served by %s, which comes before libforgealloc.so in the preload order: forgealloc "
                     "counts nothing and returns no memory; put libforgealloc.so first in LD_PRELOAD or remove %s "
                     "from it (forgealloc run does both)",
                     found, name);
}

enum fa_malloc_server fa_host_malloc_server(void) { return __atomic_load_n(&server, __ATOMIC_ACQUIRE); }

bool fa_host_served_by_same_tcmalloc(void) { return fa_host_malloc_server() == FA_SERVER_SAME_TCMALLOC; }

const char *fa_host_served_by(void) { return served_path; }

void fa_host_served_fill(struct fa_snapshot *s)
{
    s->malloc_server = fa_host_malloc_server();
    s->served_by = served_path;
    if (s->malloc_server == FA_SERVER_OTHER)
        s->tc_valid = false;
}
