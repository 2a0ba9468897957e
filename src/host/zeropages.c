/* zeropages.c - hand back resident pages that hold nothing but zeros
 * (zeropages.h). */
#define _GNU_SOURCE
#include "zeropages.h"

#include <errno.h>
#include <link.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../core/log.h"
#include "../core/sys.h"

#define CHUNK_PAGES 512 /* pages per mincore call */

/* Reads whole pages, between the variables a sanitizer knows of too. */
__attribute__((no_sanitize("address", "thread"))) static bool page_is_zero(const void *p, size_t page)
{
    const uint64_t *w = p;
    for (size_t i = 0; i < page / sizeof *w; i += 8)
        if (w[i] | w[i + 1] | w[i + 2] | w[i + 3] | w[i + 4] | w[i + 5] | w[i + 6] | w[i + 7])
            return false;
    return true;
}

static size_t drop_run(uintptr_t lo, uintptr_t hi)
{
    if (hi <= lo || madvise((void *)lo, hi - lo, MADV_DONTNEED) != 0)
        return 0; /* EINVAL for locked pages: they stay */
    return hi - lo;
}

size_t fa_zero_pages_drop(uintptr_t lo, uintptr_t hi, size_t page)
{
    size_t dropped = 0;
    unsigned char resident[CHUNK_PAGES];
    for (uintptr_t at = lo; at < hi;) {
        size_t n = (hi - at) / page;
        if (n > CHUNK_PAGES)
            n = CHUNK_PAGES;
        if (mincore((void *)at, n * page, resident) != 0) {
            n = 1; /* part of the chunk is not mapped: go page by page */
            if (mincore((void *)at, page, resident) != 0) {
                at += page;
                continue;
            }
        }
        uintptr_t run = 0; /* start of the current run of zero pages, 0 = none */
        for (size_t i = 0; i < n; i++) {
            uintptr_t p = at + i * page;
            bool zero = (resident[i] & 1) && page_is_zero((const void *)p, page);
            if (zero && !run)
                run = p;
            else if (!zero && run) {
                dropped += drop_run(run, p);
                run = 0;
            }
        }
        at += n * page;
        if (run)
            dropped += drop_run(run, at);
    }
    return dropped;
}

bool fa_zero_pages_parse_stat(const char *stat, long *threads)
{
    /* "pid (comm) state ppid ...": the name may hold spaces and parentheses,
     * so fields are counted from the last ')', which ends field 2. */
    const char *p = strrchr(stat, ')');
    if (!p)
        return false;
    for (int field = 2; *p; p++) {
        if (*p != ' ' || ++field != 20)
            continue;
        const char *v = p + 1;
        if (*v < '0' || *v > '9')
            return false;
        long x = 0;
        for (; *v >= '0' && *v <= '9' && x < 1000000000; v++)
            x = x * 10 + (*v - '0');
        *threads = x;
        return true;
    }
    return false;
}

bool fa_zero_pages_parse_maps_line(const char *line, fa_mapping *m)
{
    /* "lo-hi perms offset major:minor inode   [path]" */
    const char *p;
    if (!fa_maps_range(line, &m->lo, &m->hi, &p) || m->hi <= m->lo)
        return false;
    bool rw_private = strncmp(p, "rw-p ", 5) == 0;
    const char *field = p, *device = NULL;
    for (int i = 0; i < 3; i++) { /* past the offset to the device, then the inode */
        field = strchr(field, ' ');
        if (!field)
            return false;
        while (*field == ' ')
            field++;
        if (i == 1)
            device = field;
    }
    /* Anonymous memory has no device and no inode; a file system may
     * report inode 0 for a file. */
    bool no_inode = strncmp(device, "00:00 ", 6) == 0 && field[0] == '0' &&
                    (field[1] == ' ' || field[1] == '\n' || field[1] == '\0');
    const char *name = field + 1;
    while (*name == ' ')
        name++;
    m->anonymous = rw_private && no_inode;
    m->heap = strncmp(name, "[heap]", 6) == 0;
    return true;
}

struct mapping_list {
    fa_mapping *m;
    int n, cap;
};

static bool collect_anonymous(char *line, void *arg)
{
    struct mapping_list *l = arg;
    fa_mapping m;
    if (fa_zero_pages_parse_maps_line(line, &m) && m.anonymous)
        l->m[l->n++] = m;
    return l->n < l->cap;
}

bool fa_object_holds(const struct dl_phdr_info *info, uintptr_t addr)
{
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t start = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && addr >= start && addr < start + ph->p_memsz)
            return true;
    }
    return false;
}

struct bss_search {
    uintptr_t addr; /* an address inside the object */
    size_t page;
    uintptr_t lo[4], hi[4]; /* its BSS ranges that have whole pages */
    int n;
};

static int find_bss(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    struct bss_search *s = arg;
    if (!fa_object_holds(info, s->addr))
        return 0;
    for (int i = 0; i < info->dlpi_phnum && s->n < 4; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || ph->p_memsz <= ph->p_filesz)
            continue;
        /* The loader maps the part past the file's last page anonymously. */
        uintptr_t start = info->dlpi_addr + ph->p_vaddr;
        uintptr_t lo = (start + ph->p_filesz + s->page - 1) & ~(uintptr_t)(s->page - 1);
        uintptr_t hi = (start + ph->p_memsz + s->page - 1) & ~(uintptr_t)(s->page - 1);
        if (hi > lo) {
            s->lo[s->n] = lo;
            s->hi[s->n++] = hi;
        }
    }
    return 1;
}

#define MAX_MAPPINGS 128
/* How much of the brk heap is looked at: tcmalloc's cleared leaf is near its
 * start, and a library loaded late into a process with a large heap should
 * not read all of it. */
#define HEAP_SCAN_MAX ((uintptr_t)32 << 20)

size_t fa_zero_pages_at_start(const void *in_object)
{
    int saved_errno = errno;
    size_t dropped = 0;
    size_t page = fa_page_size();
    char stat[1024];
    long threads = 0;
    if (fa_read_file("/proc/self/stat", stat, sizeof stat) <= 0 ||
        !fa_zero_pages_parse_stat(stat, &threads) || threads != 1)
        goto out;

    /* One thread, and no signal handler can run: nothing writes a page
     * between its check and its madvise. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    fa_mapping maps[MAX_MAPPINGS];
    struct mapping_list list = {.m = maps, .cap = MAX_MAPPINGS};
    fa_read_lines("/proc/self/maps", collect_anonymous, &list);
    int n = list.n;
    struct bss_search s = {.addr = (uintptr_t)in_object, .page = page};
    if (in_object && n > 0)
        dl_iterate_phdr(find_bss, &s);
    /* Only what lies inside a private anonymous mapping is touched: the BSS
     * parts of the object and the brk heap. */
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < s.n; j++) {
            uintptr_t lo = s.lo[j] > maps[i].lo ? s.lo[j] : maps[i].lo;
            uintptr_t hi = s.hi[j] < maps[i].hi ? s.hi[j] : maps[i].hi;
            if (hi > lo)
                dropped += fa_zero_pages_drop(lo, hi, page);
        }
        if (maps[i].heap) {
            uintptr_t hi = maps[i].hi - maps[i].lo > HEAP_SCAN_MAX ? maps[i].lo + HEAP_SCAN_MAX : maps[i].hi;
            dropped += fa_zero_pages_drop(maps[i].lo, hi, page);
        }
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
out:
    errno = saved_errno;
    return dropped;
}
