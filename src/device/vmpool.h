/* vmpool.h - one device's pool of physical pieces behind address space
 * reserved once: which addresses are taken, which granules are backed by
 * which piece, the quarantine, and the idle pieces that can go back.
 *
 * Pure C over addresses: every driver call (create, map, set access,
 * unmap, release) goes through the callbacks of fa_vm_driver, so the
 * policy is tested without a device.  The reservation holds two zones of
 * `zone` bytes each:
 *  - small: blocks under FA_VM_LARGE_MIN, placed by a buddy of 512-byte
 *    units and backed by one 2 MiB piece per granule (2 MiB, the driver's
 *    granularity): a piece is idle when no live or quarantined byte lies
 *    in its granule, so one kept block pins at most its own granules;
 *  - large: blocks of FA_VM_LARGE_MIN and up, placed by a buddy of 2 MiB
 *    units, each backed by one piece of its own size (creating and
 *    granting access per piece is what costs: a 78 GB block of 2 MiB
 *    pieces took 1.6 s on an H100).  A piece here is always exactly one
 *    block's run, or idle: a block placed over idle pieces that do not
 *    match it releases them first.
 * A freed block is quarantined with the current epoch and only leaves the
 * quarantine after a device synchronisation that began later
 * (fa_vm_sync_begin/end): work queued before its cudaFree may still touch
 * it.  Only then can its granules become idle, so an idle piece can be
 * unmapped and released without a synchronisation (cuMemUnmap does not
 * wait for queued work).  Small blocks leaving the quarantine wait whole
 * in a reuse cache for the next request of the same size (PyTorch asks for
 * the same segment sizes again and again), so the buddy splits and merges
 * only when sizes change; their granules count as unused meanwhile. */
#ifndef FA_VMPOOL_H
#define FA_VMPOOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buddy.h"

#define FA_VM_GRANULE_SHIFT 21 /* 2 MiB */
#define FA_VM_GRANULE ((size_t)1 << FA_VM_GRANULE_SHIFT)
#define FA_VM_UNIT_SHIFT 9                /* 512 B: the alignment cudaMalloc gives */
#define FA_VM_LARGE_MIN ((size_t)64 << 20) /* from here on: the large zone, a piece per block */
#define FA_VM_NIL UINT32_MAX

/* The driver, as the pool needs it.  Each returns 0 on success; a failure
 * leaves nothing behind (the pool undoes its own steps). */
typedef struct fa_vm_driver {
    int (*create)(void *ctx, size_t bytes, uint64_t *handle);
    int (*release)(void *ctx, uint64_t handle);
    int (*map)(void *ctx, uintptr_t addr, size_t bytes, uint64_t handle);
    int (*unmap)(void *ctx, uintptr_t addr, size_t bytes);
    /* Grant access to [addr, addr+bytes), a run of whole mapped pieces, to
     * the owning device and every peer the program enabled. */
    int (*set_access)(void *ctx, uintptr_t addr, size_t bytes);
} fa_vm_driver;

typedef struct fa_vm_piece {
    uint64_t handle;
    uint32_t first, count; /* granules, indexed over the whole reservation */
    uint32_t prev, next;   /* idle list (oldest first), or the free-slot list */
    bool idle;
} fa_vm_piece;

typedef struct fa_vm_gran {
    uint32_t use;  /* small zone: bytes taken in the granule (live or quarantined);
                      large zone: nonzero at the first granule of a taken block */
    uint32_t quar; /* small zone: of `use`, the bytes quarantined */
} fa_vm_gran;

typedef struct fa_vm {
    uintptr_t base; /* small zone [base, base+zone), large zone [base+zone, base+2*zone) */
    size_t zone;
    uint32_t ngran;         /* granules in the reservation */
    fa_buddy small, large;
    uint32_t *gran_piece;   /* per granule: its piece, or FA_VM_NIL */
    fa_vm_gran *gran;       /* per granule */
    fa_vm_piece *pieces;    /* slots, as many as granules; count 0: a free slot */
    uint32_t slots_used;    /* slots ever used */
    uint32_t free_slot;
    uint32_t idle_head[2], idle_tail[2]; /* per zone */
    uint32_t q_head[2], q_tail[2]; /* quarantine per zone, through buddy.u[].next; epoch in .prev */
    uint32_t epoch;
    uint32_t cache[FA_BUDDY_MAX_ORDER + 1]; /* small zone reuse cache by order, through buddy.u[].next */
    uint64_t cached;                        /* bytes in it */
    size_t meta_bytes;
    /* numbers */
    uint64_t mapped;      /* bytes of pieces mapped */
    uint64_t idle;        /* bytes of idle pieces */
    uint32_t pieces_mapped, pieces_idle;
    uint64_t in_use;      /* taken by live blocks (whole units) */
    uint64_t requested;   /* asked for by live blocks */
    uint64_t quarantined; /* freed, waiting for a synchronisation */
    uint32_t quarantined_blocks; /* how many */
    uint64_t reclaimable; /* bytes of pieces the next synchronisation makes idle: the large
                             zone's quarantined blocks, and the small zone's granules whose
                             every taken byte is quarantined (a live neighbour pins one) */
    uint64_t created;     /* pieces created */
    uint64_t stolen;      /* idle pieces unmapped to back another granule instead of creating one */
} fa_vm;

typedef enum {
    FA_VM_OK,
    FA_VM_NO_SPACE,  /* no address run in the zone: the reservation is too fragmented */
    FA_VM_NO_MEMORY, /* a piece could not be created (or mapped) */
} fa_vm_result;

typedef enum {
    FA_VM_FREED,       /* quarantined */
    FA_VM_NOT_OURS,    /* outside the reservation */
    FA_VM_BAD_POINTER, /* inside it but not a live block's start */
} fa_vm_free_result;

/* Zone bytes for a device of `total` bytes: a power of two of at least
 * twice the device (address space is cheap; room against fragmentation),
 * at most what a buddy of 512-byte units covers. */
size_t fa_vm_zone_for(uint64_t total);

/* Pre: base is 2 MiB aligned, zone a power of two from 128 MiB to 1 TiB.
 * False if the host metadata could not be mapped. */
bool fa_vm_init(fa_vm *v, uintptr_t base, size_t zone);
/* Forget everything (host metadata only; the caller unmaps first). */
void fa_vm_destroy(fa_vm *v);

static inline bool fa_vm_contains(const fa_vm *v, uintptr_t a) { return v->zone && a - v->base < 2 * v->zone; }

/* Take n > 0 bytes: place the block and back every granule of it, taking
 * idle pieces (unmapped where they are) before creating new ones.  With
 * may_create false no piece is created (only idle ones are reused); with
 * drv NULL no driver call is made (memory already backed only).
 * *created gets the number of pieces created.  On failure nothing is
 * taken (pieces mapped on the way stay, idle). */
fa_vm_result fa_vm_alloc(fa_vm *v, size_t n, bool may_create, const fa_vm_driver *drv, void *ctx,
                         uintptr_t *addr, unsigned *created);
/* Quarantine the block at a.  *taken / *requested get its sizes. */
fa_vm_free_result fa_vm_free(fa_vm *v, uintptr_t a, size_t *taken, size_t *requested);
/* Start of a synchronisation: returns the epoch it covers. */
uint32_t fa_vm_sync_begin(fa_vm *v);
/* The synchronisation begun at epoch e finished: blocks quarantined up to
 * e are free again.  Returns the bytes released from the quarantine. */
uint64_t fa_vm_sync_end(fa_vm *v, uint32_t e);
/* Unmap and release idle pieces, large ones first, then (small_too) 2 MiB
 * ones oldest first, while more than `keep` bytes are mapped.  Returns the
 * number of pieces released.  (A small block that found no piece to take
 * gains nothing from releasing 2 MiB pieces: it would have moved them.) */
uint32_t fa_vm_release_idle(fa_vm *v, uint64_t keep, bool small_too, const fa_vm_driver *drv, void *ctx);
/* Grant access again on every mapped piece (a peer was enabled).
 * Returns the number of set_access calls that failed. */
int fa_vm_grant_all(fa_vm *v, const fa_vm_driver *drv, void *ctx);
/* Unmap and release every piece, whatever it holds (device reset, exit). */
void fa_vm_release_all(fa_vm *v, const fa_vm_driver *drv, void *ctx);
/* Whether freed blocks of the zone that places n-byte blocks wait in
 * quarantine (a synchronisation would give their address space back). */
bool fa_vm_zone_quarantined(const fa_vm *v, size_t n);
/* Largest block the address space could place now, in bytes. */
size_t fa_vm_largest_free(const fa_vm *v);
/* Walk every structure and count inconsistencies (0 = consistent).  Tests. */
int fa_vm_check(const fa_vm *v);

#endif
