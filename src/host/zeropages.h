/* zeropages.h - hand back resident pages that hold nothing but zeros.
 *
 * tcmalloc clears about 3 MB as it starts (its page map's root, in its
 * BSS, and the map's first leaf, from the brk heap) and writes little of it
 * afterwards, yet every cleared page stays in the process's RSS for good.
 * A private anonymous page that holds only zeros reads the same after
 * MADV_DONTNEED (the next touch maps a fresh zero page), so giving it back
 * changes nothing a program can see, provided nothing writes it between
 * the check and the madvise.  The caller guarantees that.
 *
 * startfill.h keeps those pages from being faulted in at all; this is the
 * fallback for a tcmalloc that started before the shim's first call. */
#ifndef FA_ZEROPAGES_H
#define FA_ZEROPAGES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Resident pages of [lo, hi) that hold only zeros go back to the kernel;
 * returns the bytes given back.  lo and hi are multiples of `page`; the
 * range must be private anonymous memory that no thread or signal handler
 * writes during the call.  Unmapped parts are skipped. */
size_t fa_zero_pages_drop(uintptr_t lo, uintptr_t hi, size_t page);

/* From the text of /proc/self/stat: the number of threads.  False if the
 * text is not that file's. */
bool fa_zero_pages_parse_stat(const char *stat, long *threads);

/* One line of /proc/self/maps: its range, whether it is private, readable,
 * writable and anonymous (no file), and whether it is the brk heap.  False
 * if the line is not one. */
typedef struct fa_mapping {
    uintptr_t lo, hi;
    bool anonymous, heap;
} fa_mapping;
bool fa_zero_pages_parse_maps_line(const char *line, fa_mapping *m);

/* Whether one of the loaded segments of the object dl_iterate_phdr
 * describes holds addr. */
struct dl_phdr_info;
bool fa_object_holds(const struct dl_phdr_info *info, uintptr_t addr);

/* At start: the zero pages of the BSS of the object that holds `in_object`
 * (tcmalloc) and of the brk heap (its first 32 MiB), while the process has
 * one thread and with every signal blocked; only where /proc/self/maps
 * shows private anonymous memory.  Returns the bytes given back; 0 when the
 * process already has more threads or /proc is not mounted. */
size_t fa_zero_pages_at_start(const void *in_object);

#endif
