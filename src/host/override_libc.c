/* override_libc.c - the libc allocation names, each a one-line forward to
 * the host core (host.c).  This file and override_cxx.cc are the only
 * places that define malloc-family names, but for malloc_stats, which
 * prints the process's report (src/process/override_stats.c).
 *
 * Complete coverage matters: a program that reaches glibc's
 * posix_memalign or malloc_usable_size while free goes to tcmalloc aborts
 * with "Attempt to free invalid pointer" (A1111 #11887).  glibc's own
 * internal calls go through the PLT, so defining these names is enough;
 * the __libc_* aliases catch programs that call glibc's entry points
 * directly.  The symbol-coverage test compares this list with glibc's.
 * FA_LIBC_MALLOC marks each name: a lookup of it through a handle on libc
 * (ctypes.CDLL("libc.so.6").malloc_trim) answers with it too (lookup.h). */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdlib.h>

#include "../core/export.h"
#include "fastpath.h"
#include "host.h"
#include "lookup.h"

#define FA_ALIAS(name) __attribute__((alias(#name), copy(name), visibility("default")))

FA_LIBC_MALLOC(malloc) void *malloc(size_t n) { return fa_fast_malloc(n); }
FA_LIBC_MALLOC(calloc) void *calloc(size_t n, size_t size) { return fa_fast_calloc(n, size); }
FA_LIBC_MALLOC(realloc) void *realloc(void *p, size_t n) { return fa_host_realloc(p, n, FA_CALLER); }
FA_LIBC_MALLOC(reallocarray)
void *reallocarray(void *p, size_t n, size_t size) { return fa_host_reallocarray(p, n, size, FA_CALLER); }
FA_LIBC_MALLOC(free) void free(void *p) { fa_fast_free(p); }
FA_LIBC_MALLOC(memalign) void *memalign(size_t align, size_t n) { return fa_host_memalign(align, n, FA_CALLER); }
FA_LIBC_MALLOC(aligned_alloc)
void *aligned_alloc(size_t align, size_t n) { return fa_host_aligned_alloc(align, n, FA_CALLER); }
FA_LIBC_MALLOC(posix_memalign)
int posix_memalign(void **out, size_t align, size_t n) { return fa_host_posix_memalign(out, align, n, FA_CALLER); }
FA_LIBC_MALLOC(valloc) void *valloc(size_t n) { return fa_host_valloc(n, FA_CALLER); }
FA_LIBC_MALLOC(pvalloc) void *pvalloc(size_t n) { return fa_host_pvalloc(n, FA_CALLER); }
FA_LIBC_MALLOC(malloc_usable_size) size_t malloc_usable_size(void *p) { return fa_host_usable_size(p); }

/* Removed from glibc's headers but still exported and still called by old
 * programs; C23's sized frees (the size is only a hint: freeing works
 * without it). */
FA_LIBC_MALLOC(cfree) void cfree(void *p) { fa_fast_free(p); }
FA_LIBC_MALLOC(free_sized) void free_sized(void *p, size_t size) { (void)size; fa_host_free_sized(p, FA_CALLER); }
FA_LIBC_MALLOC(free_aligned_sized)
void free_aligned_sized(void *p, size_t align, size_t size) { (void)align, (void)size; fa_host_free_sized(p, FA_CALLER); }

/* glibc's introspection, answered for tcmalloc. */
FA_LIBC_MALLOC(mallinfo2) struct mallinfo2 mallinfo2(void)
{
    struct mallinfo2 m;
    fa_host_mallinfo2(&m);
    return m;
}
FA_LIBC_MALLOC(mallinfo) struct mallinfo mallinfo(void)
{
    struct mallinfo2 m2;
    fa_host_mallinfo2(&m2);
#define FA_CLAMP_INT(v) ((v) > (size_t)__INT_MAX__ ? __INT_MAX__ : (int)(v)) /* glibc wraps; we saturate */
    struct mallinfo m = {
        .arena = FA_CLAMP_INT(m2.arena), .ordblks = FA_CLAMP_INT(m2.ordblks), .smblks = FA_CLAMP_INT(m2.smblks),
        .hblks = FA_CLAMP_INT(m2.hblks), .hblkhd = FA_CLAMP_INT(m2.hblkhd), .usmblks = FA_CLAMP_INT(m2.usmblks),
        .fsmblks = FA_CLAMP_INT(m2.fsmblks), .uordblks = FA_CLAMP_INT(m2.uordblks),
        .fordblks = FA_CLAMP_INT(m2.fordblks), .keepcost = FA_CLAMP_INT(m2.keepcost),
    };
    return m;
}
FA_LIBC_MALLOC(malloc_trim) int malloc_trim(size_t pad) { return fa_host_trim(pad); }
FA_LIBC_MALLOC(malloc_info) int malloc_info(int options, FILE *fp) { return fa_host_malloc_info(options, fp); }
/* Accepted so programs that tune glibc keep working; glibc's parameters
 * (M_MMAP_THRESHOLD, M_ARENA_MAX, ...) have no meaning for tcmalloc.  The
 * FORGEALLOC_* settings are the knobs.  The answer is glibc's: 1, but for
 * an M_MXFAST outside 0..MAX_FAST_SIZE (80 * sizeof(size_t) / 4). */
FA_LIBC_MALLOC(mallopt) int mallopt(int param, int value)
{
    if (param == M_MXFAST)
        return value >= 0 && (size_t)value <= 80 * sizeof(size_t) / 4;
    return 1;
}

/* glibc's internal entry points, exported by glibc and called directly by
 * some programs and preload tools. */
FA_LIBC_MALLOC(__libc_malloc) void *__libc_malloc(size_t n) FA_ALIAS(malloc);
FA_LIBC_MALLOC(__libc_calloc) void *__libc_calloc(size_t n, size_t size) FA_ALIAS(calloc);
FA_LIBC_MALLOC(__libc_realloc) void *__libc_realloc(void *p, size_t n) FA_ALIAS(realloc);
/* Our realloc by a name the loader never rebinds (host.h). */
void *fa_realloc_self(void *p, size_t n) __attribute__((alias("realloc"), copy(realloc), visibility("hidden")));
FA_LIBC_MALLOC(__libc_free) void __libc_free(void *p) FA_ALIAS(free);
/* Our free by a name the loader never rebinds (host.h). */
void fa_free_self(void *p) __attribute__((alias("free"), copy(free), visibility("hidden")));
FA_LIBC_MALLOC(__libc_cfree) void __libc_cfree(void *p) FA_ALIAS(cfree);
FA_LIBC_MALLOC(__libc_memalign) void *__libc_memalign(size_t align, size_t n) FA_ALIAS(memalign);
FA_LIBC_MALLOC(__libc_valloc) void *__libc_valloc(size_t n) FA_ALIAS(valloc);
FA_LIBC_MALLOC(__libc_pvalloc) void *__libc_pvalloc(size_t n) FA_ALIAS(pvalloc);
FA_LIBC_MALLOC(__posix_memalign) int __posix_memalign(void **out, size_t align, size_t n) FA_ALIAS(posix_memalign);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* glibc deprecates mallinfo; we still provide it */
FA_LIBC_MALLOC(__libc_mallinfo) struct mallinfo __libc_mallinfo(void) FA_ALIAS(mallinfo);
#pragma GCC diagnostic pop
FA_LIBC_MALLOC(__libc_mallopt) int __libc_mallopt(int param, int value) FA_ALIAS(mallopt);
