/* host.h - the host-memory core: every malloc-family and operator new/delete
 * call lands here from the override layer (override_libc.c,
 * override_cxx.cc), is counted, and is served by tcmalloc's tc_* entry
 * points.  glibc's semantics (errno, EINVAL, overflow) are kept here, not in
 * the override layer. */
#ifndef FA_HOST_H
#define FA_HOST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

struct fa_snapshot;

/* The caller's return address, for large-allocation reports (and, for
 * frees, to tell the dynamic loader's frees apart: loader.h). */
#define FA_CALLER __builtin_return_address(0)

/* The out-of-line ends of the fast paths (fastpath.h), each jumped to with
 * the program's return address.  malloc and calloc: any size the fast path
 * did not take (below 16 bytes, 4 KiB and up, a thread whose gate is
 * closed; for calloc also a product that overflows);
 * free: what the gate sent out (NULL, a page-aligned block that may be
 * large, a thread whose gate is closed; and cfree, free_sized), and a free
 * whose countdown ran out (the release policy's look is due). */
void *fa_host_malloc_other(size_t n, void *caller);
void *fa_host_calloc(size_t n, size_t size, void *caller);
void fa_host_free(void *p, void *caller) __attribute__((nothrow));
void fa_host_free_due(void *p, void *caller) __attribute__((nothrow));
/* The same for operator new and delete (the forms with no parent, or with
 * the program's replacements not in the way: override_cxx.cc; a delete
 * the gate sent out goes to fa_host_delete); n: the size of a sized
 * delete, 0 for an unsized one. */
void *fa_host_new_other(size_t n, void *caller);
void fa_host_delete_due(void *p, size_t n) __attribute__((nothrow));
/* false: operator new and delete take their out-of-line paths from now
 * on, in every thread (the program replaces some: override_cxx.cc). */
void fa_host_cxx_gates(bool open);

void *fa_host_realloc(void *p, size_t n, void *caller);
void *fa_host_reallocarray(void *p, size_t n, size_t size, void *caller);
/* The library's own realloc, under a hidden name (override_libc.c; absent,
 * so NULL, where host.c is built without it, as in unit tests). */
extern void *fa_realloc_self(void *p, size_t n) __attribute__((weak));
extern void fa_free_self(void *p) __attribute__((weak));
/* Throws std::bad_alloc (override_cxx.cc; absent, so NULL, where host.c is
 * built without it, as in unit tests). */
extern void fa_host_cxx_bad_alloc(void) __attribute__((weak, noreturn));
/* free_sized and free_aligned_sized (C23): a free, or where another
 * allocator serves malloc without them, that allocator's free. */
void fa_host_free_sized(void *p, void *caller);
void *fa_host_memalign(size_t align, size_t n, void *caller);
void *fa_host_aligned_alloc(size_t align, size_t n, void *caller);
int fa_host_posix_memalign(void **out, size_t align, size_t n, void *caller);
void *fa_host_valloc(size_t n, void *caller);
void *fa_host_pvalloc(size_t n, void *caller);
size_t fa_host_usable_size(void *p);

/* operator new outside the fast path (aligned, nothrow): align 0 = default
 * alignment.  The new-handler is honoured and std::bad_alloc thrown by
 * tcmalloc's tc_new family; the nothrow forms catch whatever is thrown
 * (override_cxx.cc). */
void *fa_host_new(size_t n, size_t align, void *caller);
/* operator delete outside the fast path (aligned, nothrow): size 0 =
 * unsized; align 0 = default alignment. */
void fa_host_delete(void *p, size_t size, size_t align) __attribute__((nothrow));
/* At start, once it is known who serves malloc: whether the program (or an
 * allocator ahead of forgealloc) replaces some operator new/delete, so the
 * forms forgealloc serves must call the replacements (override_cxx.cc). */
void fa_host_cxx_check(void);

/* glibc introspection answered for tcmalloc. */
struct mallinfo2;
void fa_host_mallinfo2(struct mallinfo2 *out);
int fa_host_trim(size_t pad);
int fa_host_malloc_info(int options, FILE *fp);

/* Return all free memory to the OS; returns the bytes returned. */
size_t fa_host_release_all(void);

/* Fill the host part of a snapshot.  With s->in_signal set, tcmalloc is
 * not called: its numbers come from the last copy taken outside signals. */
void fa_host_fill(struct fa_snapshot *s);

/* At library start, after tcmalloc's own initialisers: put tcmalloc's
 * memset back (startfill.h) and apply the settings tcmalloc reads only at
 * load (the release rate). */
void fa_host_start(void);
/* Then, once it is known who serves malloc (served.h): where tcmalloc's
 * start did fault in the pages it cleared, give back those that hold only
 * zeros (zeropages.h). */
void fa_host_start_pages(void);
/* After fork, in the child. */
void fa_host_fork_child(void);
/* fa_host_fork_child for the child of a fork that ran no fork handlers
 * (core/owner.h): async-signal-safe, no call into tcmalloc (signal-time
 * reports show the parent's last copy of its numbers, and their age,
 * until the child's next refresh). */
void fa_host_adopt(void);
/* At exit, before the dump: one line for the large-allocation reports the
 * rate limit held back since the last one printed. */
void fa_host_stop(void);

#ifdef __cplusplus
}
#endif

#endif
