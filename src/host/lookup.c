/* lookup.c - where a dlsym or dlvsym call goes (lookup.h), and the answer
 * for libc's malloc-family names looked up through a handle on libc. */
#define _GNU_SOURCE
#include "lookup.h"

#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <stdint.h>
#include <string.h>

#include "dynsym.h"
#include "zeropages.h"

typedef void *(*sym_fn)(void *, const char *);
typedef void *(*vsym_fn)(void *, const char *, const char *);

/* The table FA_LIBC_MALLOC fills; the linker names its bounds. */
extern const char *const __start_fa_libc_malloc[] __attribute__((visibility("hidden")));
extern const char *const __stop_fa_libc_malloc[] __attribute__((visibility("hidden")));

/* Every dlsym through a handle asks whether its name is one of them, so
 * once the next dlsym is known the names are also indexed by a hash (open
 * addressing, at most half full): a name not there costs its hash and a
 * comparison or two instead of one per name. */
#define NAME_SLOTS 128
static const char *name_slots[NAME_SLOTS];
static bool indexed;    /* name_slots holds every name */
static int found_state; /* 0: not yet; 1: being written; 2: ready (found, name_slots, indexed) */

static uint32_t name_hash(const char *s)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

static void index_names(void)
{
    if (__stop_fa_libc_malloc - __start_fa_libc_malloc > NAME_SLOTS / 2)
        return; /* too many for the index: they are compared one by one */
    for (const char *const *n = __start_fa_libc_malloc; n < __stop_fa_libc_malloc; n++) {
        uint32_t i = name_hash(*n);
        while (name_slots[i % NAME_SLOTS])
            i++;
        name_slots[i % NAME_SLOTS] = *n;
    }
    indexed = true;
}

bool fa_libc_malloc_name(const char *name)
{
    if (__atomic_load_n(&found_state, __ATOMIC_ACQUIRE) == 2 && indexed) {
        for (uint32_t i = name_hash(name); name_slots[i % NAME_SLOTS]; i++)
            if (strcmp(name_slots[i % NAME_SLOTS], name) == 0)
                return true;
        return false;
    }
    for (const char *const *n = __start_fa_libc_malloc; n < __stop_fa_libc_malloc; n++)
        if (strcmp(*n, name) == 0)
            return true;
    return false;
}

/* ---- the next dlsym and dlvsym ---------------------------------------------- */

struct next {
    sym_fn sym;
    vsym_fn vsym;
    bool has_libc;
    struct dl_phdr_info libc; /* glibc's libc.so.6 */
};
static struct next found;

/* Our own dlsym would answer a call of dlsym from here, so glibc's is read
 * from its symbol table: in libc.so.6 since glibc 2.34, in libdl.so.2
 * before.  Then glibc's, asked from here with RTLD_NEXT, names the next
 * definition after ours: glibc's own, or one of a library preloaded after
 * forgealloc (which would have got the call without us). */
static void find_next(struct next *n)
{
    memset(n, 0, sizeof *n);
    n->has_libc = fa_dynsym_object("libc.so.6", &n->libc);
    struct dl_phdr_info dl;
    sym_fn sym = NULL;
    vsym_fn vsym = NULL;
    if (n->has_libc) {
        sym = (sym_fn)fa_dynsym_lookup(&n->libc, "dlsym");
        vsym = (vsym_fn)fa_dynsym_lookup(&n->libc, "dlvsym");
    }
    if ((!sym || !vsym) && fa_dynsym_object("libdl.so.2", &dl)) {
        sym = (sym_fn)fa_dynsym_lookup(&dl, "dlsym");
        vsym = (vsym_fn)fa_dynsym_lookup(&dl, "dlvsym");
    }
    if (!sym || !vsym)
        return;
    sym_fn next_sym = (sym_fn)sym(RTLD_NEXT, "dlsym");
    vsym_fn next_vsym = (vsym_fn)sym(RTLD_NEXT, "dlvsym");
    n->sym = next_sym ? next_sym : sym;
    n->vsym = next_vsym ? next_vsym : vsym;
}

/* Found once (until then each caller finds its own copy in `mine`). */
static const struct next *next(struct next *mine)
{
    if (__atomic_load_n(&found_state, __ATOMIC_ACQUIRE) == 2)
        return &found;
    int saved = errno;
    find_next(mine);
    errno = saved;
    int expect = 0;
    if (mine->sym && __atomic_compare_exchange_n(&found_state, &expect, 1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        found = *mine;
        index_names();
        __atomic_store_n(&found_state, 2, __ATOMIC_RELEASE);
    }
    return mine;
}

/* ---- the answer for a handle on libc ---------------------------------------- */

/* Whether the object that calls (return address `caller`) defines q
 * itself: an allocator or a wrapper that asks libc for the function its
 * own definition stands in front of.  A program's PLT entry that stands
 * for a function's address (a program built without PIE) defines nothing. */
static bool defined_by_caller(void *q, const void *caller)
{
    Dl_info qi, ci;
    const ElfW(Sym) *sym = NULL;
    if (!dladdr1(q, &qi, (void **)&sym, RTLD_DL_SYMENT) || !sym || sym->st_shndx == SHN_UNDEF)
        return false;
    return dladdr(caller, &ci) && ci.dli_fbase == qi.dli_fbase;
}

/* p: what the lookup through the handle found.  Where it lies in glibc,
 * the program's binding of the name instead: the first definition in the
 * global scope.  A program's references carry glibc's versions, and bind to
 * an unversioned definition all the same; dlvsym(RTLD_DEFAULT) would pass
 * over one, so the lookup is unversioned for dlvsym's answer too.  The
 * last lookup made succeeded, so dlerror() reports nothing, as after p's. */
static void *program_binding(const struct next *n, void *p, const char *name, const void *caller)
{
    if (!p || !fa_object_holds(&n->libc, (uintptr_t)p))
        return p;
    int saved = errno;
    void *q = n->sym(RTLD_DEFAULT, name);
    if (q && defined_by_caller(q, caller))
        q = NULL;
    errno = saved;
    return q ? q : p;
}

/* Entered by a jump from dlsym: the return address is the caller's. */
__attribute__((noinline)) static void *answer_sym(void *handle, const char *name)
{
    struct next mine;
    const struct next *n = next(&mine);
    return program_binding(n, n->sym(handle, name), name, __builtin_return_address(0));
}

__attribute__((noinline)) static void *answer_vsym(void *handle, const char *name, const char *version)
{
    struct next mine;
    const struct next *n = next(&mine);
    return program_binding(n, n->vsym(handle, name, version), name, __builtin_return_address(0));
}

/* ---- routes -------------------------------------------------------------------- */

/* Without glibc's dlsym there is nothing to forward to (not glibc). */
static void *missing_sym(void *handle, const char *name) { return (void)handle, (void)name, NULL; }
static void *missing_vsym(void *handle, const char *name, const char *version)
{
    return (void)handle, (void)name, (void)version, NULL;
}

/* Only real handles reach an answer: RTLD_DEFAULT and RTLD_NEXT search
 * relative to the caller and always go on to the next dlsym. */
static bool answered(const struct next *n, void *handle, const char *name)
{
    return n->has_libc && handle != RTLD_DEFAULT && handle != RTLD_NEXT && name && fa_libc_malloc_name(name);
}

__attribute__((used)) void *fa_lookup_route_sym(void *handle, const char *name)
{
    struct next mine;
    const struct next *n = next(&mine);
    if (!n->sym)
        return (void *)missing_sym;
    return answered(n, handle, name) ? (void *)answer_sym : (void *)n->sym;
}

__attribute__((used)) void *fa_lookup_route_vsym(void *handle, const char *name, const char *version)
{
    (void)version;
    struct next mine;
    const struct next *n = next(&mine);
    if (!n->sym)
        return (void *)missing_vsym;
    return answered(n, handle, name) ? (void *)answer_vsym : (void *)n->vsym;
}
