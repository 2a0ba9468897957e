/* dynsym.c - a loaded library by name, and a definition from its dynamic
 * symbol table (dynsym.h).  The loader's own lookup walks the same hash
 * tables; only the object's own table is read, never its dependencies. */
#define _GNU_SOURCE
#include "dynsym.h"

#include <elf.h>
#include <stdint.h>
#include <string.h>

struct object_search {
    const char *soname;
    struct dl_phdr_info *out;
    bool found;
};

static int find_object(struct dl_phdr_info *info, size_t size, void *arg)
{
    struct object_search *s = arg;
    const char *name = info->dlpi_name ? info->dlpi_name : "";
    const char *slash = strrchr(name, '/');
    if (strcmp(slash ? slash + 1 : name, s->soname) != 0)
        return 0;
    memset(s->out, 0, sizeof *s->out);
    memcpy(s->out, info, size < sizeof *s->out ? size : sizeof *s->out);
    s->found = true;
    return 1;
}

bool fa_dynsym_object(const char *soname, struct dl_phdr_info *out)
{
    struct object_search s = {.soname = soname, .out = out};
    dl_iterate_phdr(find_object, &s);
    return s.found;
}

/* The parts of an object's dynamic section a lookup reads. */
struct dyn {
    uintptr_t base;
    const ElfW(Sym) *syms;
    const char *strs;
    size_t strsz;
    const uint32_t *gnu_hash, *sysv_hash;
    const ElfW(Half) *versym;
};

static bool read_dyn(const struct dl_phdr_info *obj, struct dyn *d)
{
    memset(d, 0, sizeof *d);
    d->base = obj->dlpi_addr;
    const ElfW(Dyn) *dyn = NULL;
    for (int i = 0; i < obj->dlpi_phnum; i++)
        if (obj->dlpi_phdr[i].p_type == PT_DYNAMIC)
            dyn = (const ElfW(Dyn) *)(d->base + obj->dlpi_phdr[i].p_vaddr);
    /* glibc's loader rewrites these addresses to run-time ones in place;
     * others may leave them as in the file, relative to the load address. */
#define RUNTIME(v) ((v) && (v) < d->base ? (v) + d->base : (v))
    for (; dyn && dyn->d_tag != DT_NULL; dyn++) {
        uintptr_t p = RUNTIME(dyn->d_un.d_ptr);
        switch (dyn->d_tag) {
        case DT_SYMTAB: d->syms = (const ElfW(Sym) *)p; break;
        case DT_STRTAB: d->strs = (const char *)p; break;
        case DT_STRSZ: d->strsz = dyn->d_un.d_val; break;
        case DT_GNU_HASH: d->gnu_hash = (const uint32_t *)p; break;
        case DT_HASH: d->sysv_hash = (const uint32_t *)p; break;
        case DT_VERSYM: d->versym = (const ElfW(Half) *)p; break;
        }
    }
#undef RUNTIME
    return d->syms && d->strs && (d->gnu_hash || d->sysv_hash);
}

enum verdict { OTHER, FOUND, REFUSED };

/* Whether symbol i is the definition of name that an unversioned
 * reference binds to. */
static enum verdict check(const struct dyn *d, uint32_t i, const char *name)
{
    const ElfW(Sym) *s = &d->syms[i];
    if (s->st_name >= d->strsz || strcmp(d->strs + s->st_name, name) != 0)
        return OTHER;
    unsigned bind = ELF64_ST_BIND(s->st_info), type = ELF64_ST_TYPE(s->st_info); /* the same in both classes */
    if (s->st_shndx == SHN_UNDEF || (bind != STB_GLOBAL && bind != STB_WEAK))
        return OTHER;
    /* Index 0 is local; the high bit marks a version only a versioned
     * reference may bind to (name@VERSION, not name@@VERSION). */
    if (d->versym && ((d->versym[i] & 0x8000) || d->versym[i] == 0))
        return OTHER;
    return type == STT_GNU_IFUNC || type == STT_TLS ? REFUSED : FOUND;
}

static uint32_t gnu_hash(const char *s)
{
    uint32_t h = 5381;
    for (; *s; s++)
        h = h * 33 + (unsigned char)*s;
    return h;
}

static uint32_t sysv_hash(const char *s)
{
    uint32_t h = 0;
    for (; *s; s++) {
        h = (h << 4) + (unsigned char)*s;
        uint32_t g = h & 0xf0000000u;
        if (g)
            h ^= g >> 24;
        h &= ~g;
    }
    return h;
}

/* The index of the symbol, or 0 (STN_UNDEF) where none is bound to. */
static uint32_t find_gnu(const struct dyn *d, const char *name)
{
    const uint32_t *t = d->gnu_hash;
    uint32_t nbuckets = t[0], symoffset = t[1], bloom_words = t[2];
    if (nbuckets == 0)
        return 0;
    const uint32_t *buckets = (const uint32_t *)((const ElfW(Addr) *)(t + 4) + bloom_words);
    const uint32_t *chain = buckets + nbuckets;
    uint32_t h = gnu_hash(name);
    uint32_t i = buckets[h % nbuckets];
    if (i == 0 || i < symoffset)
        return 0;
    for (;; i++) {
        uint32_t h2 = chain[i - symoffset];
        if ((h | 1) == (h2 | 1)) {
            enum verdict v = check(d, i, name);
            if (v != OTHER)
                return v == FOUND ? i : 0;
        }
        if (h2 & 1)
            return 0;
    }
}

static uint32_t find_sysv(const struct dyn *d, const char *name)
{
    const uint32_t *t = d->sysv_hash;
    uint32_t nbucket = t[0], nchain = t[1];
    if (nbucket == 0)
        return 0;
    const uint32_t *bucket = t + 2, *chain = bucket + nbucket;
    for (uint32_t i = bucket[sysv_hash(name) % nbucket], n = 0; i != STN_UNDEF && i < nchain && n < nchain;
         i = chain[i], n++) {
        enum verdict v = check(d, i, name);
        if (v != OTHER)
            return v == FOUND ? i : 0;
    }
    return 0;
}

void *fa_dynsym_lookup(const struct dl_phdr_info *obj, const char *name)
{
    struct dyn d;
    if (!read_dyn(obj, &d))
        return NULL;
    uint32_t i = d.gnu_hash ? find_gnu(&d, name) : find_sysv(&d, name);
    return i ? (void *)(d.base + d.syms[i].st_value) : NULL;
}
