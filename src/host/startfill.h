/* startfill.h - clearing memory without faulting in what reads as zeros:
 * tcmalloc's start, and large callocs.
 *
 * As it starts, tcmalloc 2.10 clears about 3 MB with memset: its page
 * map's root (1 MB of its BSS) and the map's first leaf (2 MB from the brk
 * heap).  Both are fresh memory that already reads as zeros, yet clearing
 * it faults in every page (about 750 page faults, most of the cost of
 * starting a process under tcmalloc) and keeps them in the RSS for good.
 *
 * While tcmalloc starts, its memset is pointed at fa_start_fill, which
 * writes only the pages that hold something: in private anonymous memory,
 * a page that is neither resident nor swapped out reads as zeros already.
 * The slot is found in tcmalloc's relocations (its PLT or GOT entry for
 * memset) and put back once tcmalloc has started.
 *
 * tcmalloc's calloc clears every block the same way, so a large calloc of
 * fresh memory faults in all of it (glibc's leaves fresh mmap memory as it
 * is); forgealloc clears large calloc blocks with fa_clear_anonymous. */
#ifndef FA_STARTFILL_H
#define FA_STARTFILL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* memset(p, c, n), but the whole pages of [p, p+n) that lie in private
 * anonymous memory and are neither resident nor swapped out are left as
 * they are when c is 0 (they read as zeros).  Adds to the bytes it left
 * (fa_start_fill_left).  Does not allocate; errno is kept. */
void *fa_start_fill(void *p, int c, size_t n);

/* The bytes fa_start_fill has left untouched so far. */
size_t fa_start_fill_left(void);

/* memset(p, 0, n) for memory known to be private and anonymous (tcmalloc's
 * heap, unless TCMALLOC_MEMFS_MALLOC_PATH puts it on hugetlbfs): whole
 * pages that are neither resident nor swapped out are left as they are.
 * Returns the bytes left.  Does not allocate; errno is kept. */
size_t fa_clear_anonymous(void *p, size_t n);

/* The address of the relocated pointer through which the object holding
 * `in_object` calls `name` (its PLT slot or GOT entry), and whether that
 * slot lies in the object's read-only-after-relocation part (RELRO).
 * False if the object does not call `name` through one. */
typedef struct fa_got_slot {
    void **at;
    bool relro;
} fa_got_slot;
bool fa_got_find(const void *in_object, const char *name, fa_got_slot *out);

/* Whether the loader write-protects `at` for a PT_GNU_RELRO segment of
 * [lo, lo+size): like glibc, only its whole pages (a last partial page
 * stays writable, shared with data that follows). */
static inline bool fa_relro_protects(uintptr_t lo, size_t size, size_t page, uintptr_t at)
{
    uintptr_t mask = ~(uintptr_t)(page - 1);
    return at >= (lo & mask) && at < ((lo + size) & mask);
}

/* Stores `value` in the slot (lifting RELRO's write protection around the
 * store) and returns what it held in *old.  False if it cannot. */
bool fa_got_swap(const fa_got_slot *slot, void *value, void **old);

/* Around tcmalloc's start: begin points the memset of the object holding
 * `in_tcmalloc` at fa_start_fill, end puts it back.  Both run where only
 * one thread can call them (before and in the library's constructor). */
void fa_start_fill_begin(const void *in_tcmalloc);
void fa_start_fill_end(void);

#endif
