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

bool fa_zero_pages_parse_stat(const char *stat, long *threads, uintptr_t *start_brk)
{
    /* "pid (comm) state ppid ...": the name may hold spaces and parentheses,
     * so fields are counted from the last ')', which ends field 2. */
    const char *p = strrchr(stat, ')');
    if (!p)
        return false;
    bool have_threads = false, have_brk = false;
    for (int field = 2; *p; p++) {
        if (*p != ' ')
            continue;
        field++;
        const char *v = p + 1;
        if (field != 20 && field != 47)
            continue;
        if (*v < '0' || *v > '9')
            return false;
        unsigned long long x = 0;
        for (; *v >= '0' && *v <= '9'; v++)
            x = x * 10 + (unsigned long long)(*v - '0');
        if (field == 20) {
            *threads = (long)x;
            have_threads = true;
        } else {
            *start_brk = (uintptr_t)x;
            have_brk = true;
            break;
        }
    }
    return have_threads && have_brk;
}

struct bss_search {
    uintptr_t addr;   /* an address inside the object */
    size_t page;
    uintptr_t lo[4], hi[4]; /* its BSS ranges that have whole pages */
    int n;
};

static int find_bss(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    struct bss_search *s = arg;
    bool ours = false;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t start = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && s->addr >= start && s->addr < start + ph->p_memsz)
            ours = true;
    }
    if (!ours)
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

size_t fa_zero_pages_at_start(const void *in_object)
{
    int saved_errno = errno;
    size_t dropped = 0;
    long page = sysconf(_SC_PAGESIZE);
    char stat[1024];
    long threads = 0;
    uintptr_t start_brk = 0;
    if (page <= 0 || fa_read_file("/proc/self/stat", stat, sizeof stat) <= 0 ||
        !fa_zero_pages_parse_stat(stat, &threads, &start_brk) || threads != 1)
        goto out;

    struct bss_search s = {.addr = (uintptr_t)in_object, .page = (size_t)page};
    if (in_object)
        dl_iterate_phdr(find_bss, &s);

    /* One thread, and no signal handler can run: nothing writes a page
     * between its check and its madvise. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (int i = 0; i < s.n; i++)
        dropped += fa_zero_pages_drop(s.lo[i], s.hi[i], (size_t)page);
    uintptr_t brk_end = (uintptr_t)sbrk(0);
    if (start_brk && brk_end != (uintptr_t)-1 && brk_end > start_brk) {
        uintptr_t lo = (start_brk + (uintptr_t)page - 1) & ~(uintptr_t)(page - 1);
        uintptr_t hi = brk_end & ~(uintptr_t)(page - 1);
        if (hi > lo)
            dropped += fa_zero_pages_drop(lo, hi, (size_t)page);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
out:
    errno = saved_errno;
    return dropped;
}
