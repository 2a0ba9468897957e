/* grown.h - large blocks that realloc grows live in mappings of their own.
 *
 * tcmalloc's realloc grows a block by allocating a larger one, copying and
 * freeing the old one, which its page heap then keeps: a buffer grown to
 * 800 MB step by step (CPython's bytearray and BytesIO, pickle's output,
 * a list's item array) copies several times its final size and peaks at
 * about 2.5 times it.  glibc resizes such blocks with mremap.  Here a
 * tcmalloc block that realloc must move to FA_GROWN_MIN bytes or more
 * goes, with one copy, into a mapping of its own; from then on realloc
 * resizes that mapping with mremap (the kernel moves page tables, not
 * bytes), and free unmaps it.  The release policy's table of large
 * blocks holds such blocks with FA_RELEASE_MAPPED (release.h), so every
 * free path tells them from tcmalloc's. */
#ifndef FA_GROWN_H
#define FA_GROWN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Growth to this size or more leaves tcmalloc: below it, the copies cost
 * less than the system calls and the fresh pages of a mapping. */
#define FA_GROWN_MIN ((size_t)4 << 20)

/* The tcmalloc block p, of which the first `keep` bytes are kept, moves
 * to a fresh mapping of n bytes, remembered as grown; the caller frees p.
 * NULL where no mapping or no slot in the table can be had: the caller
 * then lets tcmalloc's realloc move it. */
void *fa_grown_adopt(const void *p, size_t keep, size_t n);
/* realloc of the grown block p of `old` bytes (forgotten by the caller
 * only on success) to n > 0 bytes.  Returns the block, resized in place
 * or moved by the kernel, and remembered at its new size; NULL with errno
 * ENOMEM and p intact where no new range can be mapped (the old and the
 * new one are mapped at once while it moves).  Where the table has no
 * slot for a moved block, it becomes a tcmalloc block instead and *to_tc
 * is set (the caller counts it as a large allocation). */
void *fa_grown_realloc(void *p, size_t old, size_t n, bool *to_tc);
/* Transparent huge pages for the whole mapping (FORGEALLOC_HUGEPAGES):
 * advising part of it would split it, and a split mapping cannot be
 * resized in place. */
void fa_grown_advise_huge(void *p, size_t n);
/* Unmap the grown block at p of n bytes (already forgotten). */
void fa_grown_free(void *p, size_t n);
/* Usable size of a grown block of n bytes: its mapping's length. */
size_t fa_grown_usable(size_t n);
/* Bytes of live grown blocks' mappings. */
uint64_t fa_grown_bytes(void);

#endif
