/* startfill.c - clearing memory without faulting in what reads as zeros
 * (startfill.h). */
#define _GNU_SOURCE
#include "startfill.h"

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../core/log.h"
#include "../core/sys.h"
#include "zeropages.h"

#if defined(__x86_64__) && defined(__LP64__)
#define FA_R_JUMP_SLOT R_X86_64_JUMP_SLOT
#define FA_R_GLOB_DAT R_X86_64_GLOB_DAT
#elif defined(__aarch64__)
#define FA_R_JUMP_SLOT R_AARCH64_JUMP_SLOT
#define FA_R_GLOB_DAT R_AARCH64_GLOB_DAT
#endif

#define FILL_MIN ((size_t)64 << 10) /* smaller fills are written whole */
#define MAX_RANGES 8                /* anonymous mappings one fill may span */
#define PAGEMAP_CHUNK 128           /* pagemap entries read at a time (1 KiB of the caller's stack) */
#define PM_SOFT_DIRTY ((uint64_t)1 << 55)

static size_t left_bytes;

size_t fa_start_fill_left(void) { return __atomic_load_n(&left_bytes, __ATOMIC_RELAXED); }

/* ---- the fill ------------------------------------------------------------ */

/* The parts of [lo, hi) that lie in private anonymous mappings, in address
 * order (/proc/self/maps is sorted). */
struct anon_ranges {
    uintptr_t lo, hi;
    uintptr_t a[MAX_RANGES], b[MAX_RANGES];
    int n;
};

static bool collect_anonymous(char *line, void *arg)
{
    struct anon_ranges *r = arg;
    fa_mapping m;
    if (!fa_zero_pages_parse_maps_line(line, &m))
        return true;
    if (m.lo >= r->hi)
        return false;
    if (m.hi <= r->lo || !m.anonymous)
        return true;
    r->a[r->n] = m.lo > r->lo ? m.lo : r->lo;
    r->b[r->n] = m.hi < r->hi ? m.hi : r->hi;
    return ++r->n < MAX_RANGES;
}

/* Clears the pages of [a, b) (private anonymous memory, whole pages) that
 * hold something; returns the bytes of those that did not need it.  A page
 * whose pagemap entry is empty (not present, not swapped, no marker; the
 * soft-dirty bit says nothing of its contents) reads as zeros. */
static size_t fill_sparse(int pagemap, uintptr_t a, uintptr_t b, size_t page)
{
    size_t left = 0;
    uint64_t e[PAGEMAP_CHUNK];
    for (uintptr_t at = a; at < b;) {
        size_t n = (b - at) / page;
        if (n > PAGEMAP_CHUNK)
            n = PAGEMAP_CHUNK;
        if (pagemap < 0 || fa_sys_pread(pagemap, e, n * sizeof *e, (off_t)(at / page * sizeof *e)) != (ssize_t)(n * sizeof *e)) {
            memset((void *)at, 0, b - at);
            break;
        }
        uintptr_t run = 0; /* start of a run of pages to clear, 0 = none */
        for (size_t i = 0; i < n; i++) {
            uintptr_t p = at + i * page;
            bool untouched = (e[i] & ~PM_SOFT_DIRTY) == 0;
            if (untouched) {
                left += page;
                if (run) {
                    memset((void *)run, 0, p - run);
                    run = 0;
                }
            } else if (!run) {
                run = p;
            }
        }
        at += n * page;
        if (run)
            memset((void *)run, 0, at - run);
    }
    return left;
}

void *fa_start_fill(void *p, int c, size_t n)
{
    uintptr_t s = (uintptr_t)p, e;
    size_t page = fa_page_size();
    if (c != 0 || n < FILL_MIN || __builtin_add_overflow(s, n, &e))
        return memset(p, c, n);
    struct anon_ranges r = {.lo = (s + page - 1) & ~(uintptr_t)(page - 1), .hi = e & ~(uintptr_t)(page - 1)};
    if (r.hi <= r.lo)
        return memset(p, c, n);
    int saved = errno;
    fa_read_lines("/proc/self/maps", collect_anonymous, &r);
    int pagemap = r.n ? fa_sys_open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC) : -1;
    uintptr_t at = s;
    size_t left = 0;
    for (int i = 0; i < r.n; i++) {
        memset((void *)at, 0, r.a[i] - at);
        left += fill_sparse(pagemap, r.a[i], r.b[i], page);
        at = r.b[i];
    }
    memset((void *)at, 0, e - at);
    if (pagemap >= 0)
        fa_sys_close(pagemap);
    __atomic_fetch_add(&left_bytes, left, __ATOMIC_RELAXED);
    errno = saved;
    return p;
}

size_t fa_clear_anonymous(void *p, size_t n)
{
    uintptr_t s = (uintptr_t)p, e = s + n;
    size_t page = fa_page_size();
    uintptr_t a = (s + page - 1) & ~(uintptr_t)(page - 1), b = e & ~(uintptr_t)(page - 1);
    if (b <= a) {
        memset(p, 0, n);
        return 0;
    }
    int saved = errno;
    int pagemap = fa_sys_open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    memset(p, 0, a - s);
    size_t left = fill_sparse(pagemap, a, b, page);
    memset((void *)b, 0, e - b);
    if (pagemap >= 0)
        fa_sys_close(pagemap);
    errno = saved;
    return left;
}

/* ---- the slot -------------------------------------------------------------- */

struct slot_search {
    uintptr_t addr;
    const char *name;
    fa_got_slot *out;
    bool found;
};

#ifdef FA_R_JUMP_SLOT
/* The relocation of `type` in rel[0..size) that names `name`, if any. */
static const ElfW(Rela) *find_reloc(const ElfW(Rela) *rel, size_t size, unsigned long type, const ElfW(Sym) *syms,
                                    const char *strs, size_t strsz, const char *name)
{
    for (size_t i = 0; rel && i < size / sizeof *rel; i++) {
        if (ELF64_R_TYPE(rel[i].r_info) != type)
            continue;
        const ElfW(Sym) *sym = &syms[ELF64_R_SYM(rel[i].r_info)];
        if (sym->st_name < strsz && sym->st_shndx == SHN_UNDEF && strcmp(strs + sym->st_name, name) == 0)
            return &rel[i];
    }
    return NULL;
}
#endif

static int find_slot(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    struct slot_search *s = arg;
    if (!fa_object_holds(info, s->addr))
        return 0;
#ifdef FA_R_JUMP_SLOT
    uintptr_t base = info->dlpi_addr, relro_lo = 0;
    size_t relro_size = 0;
    const ElfW(Dyn) *dyn = NULL;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_DYNAMIC)
            dyn = (const ElfW(Dyn) *)(base + ph->p_vaddr);
        else if (ph->p_type == PT_GNU_RELRO) {
            relro_lo = base + ph->p_vaddr;
            relro_size = ph->p_memsz;
        }
    }
    uintptr_t symtab = 0, strtab = 0, jmprel = 0, rela = 0;
    size_t strsz = 0, pltrelsz = 0, relasz = 0;
    long pltrel = 0;
    for (; dyn && dyn->d_tag != DT_NULL; dyn++) {
        switch (dyn->d_tag) {
        case DT_SYMTAB: symtab = dyn->d_un.d_ptr; break;
        case DT_STRTAB: strtab = dyn->d_un.d_ptr; break;
        case DT_STRSZ: strsz = dyn->d_un.d_val; break;
        case DT_JMPREL: jmprel = dyn->d_un.d_ptr; break;
        case DT_PLTRELSZ: pltrelsz = dyn->d_un.d_val; break;
        case DT_PLTREL: pltrel = (long)dyn->d_un.d_val; break;
        case DT_RELA: rela = dyn->d_un.d_ptr; break;
        case DT_RELASZ: relasz = dyn->d_un.d_val; break;
        }
    }
    if (!symtab || !strtab)
        return 1;
    /* glibc's loader rewrites these addresses to run-time ones; others may
     * leave them as in the file, relative to the load address. */
#define RUNTIME(v) ((v) && (v) < base ? (v) + base : (v))
    const ElfW(Sym) *syms = (const ElfW(Sym) *)RUNTIME(symtab);
    const char *strs = (const char *)RUNTIME(strtab);
    const ElfW(Rela) *r = NULL;
    if (pltrel == DT_RELA)
        r = find_reloc((const ElfW(Rela) *)RUNTIME(jmprel), pltrelsz, FA_R_JUMP_SLOT, syms, strs, strsz, s->name);
    if (!r) /* called through the GOT (-fno-plt) */
        r = find_reloc((const ElfW(Rela) *)RUNTIME(rela), relasz, FA_R_GLOB_DAT, syms, strs, strsz, s->name);
#undef RUNTIME
    if (r) {
        uintptr_t at = base + r->r_offset;
        s->out->at = (void **)at;
        s->out->relro = relro_size && fa_relro_protects(relro_lo, relro_size, fa_page_size(), at);
        s->found = true;
    }
#endif
    return 1;
}

bool fa_got_find(const void *in_object, const char *name, fa_got_slot *out)
{
    struct slot_search s = {.addr = (uintptr_t)in_object, .name = name, .out = out};
    dl_iterate_phdr(find_slot, &s);
    return s.found;
}

bool fa_got_swap(const fa_got_slot *slot, void *value, void **old)
{
    size_t page = fa_page_size();
    void *pg = (void *)((uintptr_t)slot->at & ~(uintptr_t)(page - 1));
    if (slot->relro && mprotect(pg, page, PROT_READ | PROT_WRITE) != 0)
        return false;
    *old = __atomic_exchange_n(slot->at, value, __ATOMIC_SEQ_CST);
    if (slot->relro)
        mprotect(pg, page, PROT_READ);
    return true;
}

/* ---- around tcmalloc's start ----------------------------------------------- */

static fa_got_slot fill_slot;
static void *fill_saved; /* what the slot held */
static bool fill_on;

void fa_start_fill_begin(const void *in_tcmalloc)
{
    int saved = errno;
    /* In one object with tcmalloc (a static build), fa_start_fill's own
     * memset would be itself. */
    Dl_info tc, ours;
    bool apart = dladdr(in_tcmalloc, &tc) && dladdr((const void *)fa_start_fill, &ours) &&
                 tc.dli_fbase != ours.dli_fbase;
    fa_got_slot s;
    if (apart && !fill_on && fa_got_find(in_tcmalloc, "memset", &s) &&
        fa_got_swap(&s, (void *)fa_start_fill, &fill_saved)) {
        fill_slot = s;
        fill_on = true;
    }
    errno = saved;
}

void fa_start_fill_end(void)
{
    if (!fill_on)
        return;
    int saved = errno;
    void *held;
    if (fa_got_swap(&fill_slot, fill_saved, &held) && held != (void *)fa_start_fill)
        fa_got_swap(&fill_slot, held, &held); /* someone else's since: theirs stays */
    fill_on = false;
    errno = saved;
}
