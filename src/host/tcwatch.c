/* tcwatch.c - tcmalloc's heap outgrew a size (tcwatch.h).
 *
 * tcmalloc takes memory from the system through sbrk and mmap and tells
 * its mmap and sbrk hooks; it never gives address space back.  Those hooks
 * run under tcmalloc's page heap lock, where asking tcmalloc anything or
 * starting a thread (which allocates) would wait on that lock for ever:
 * they only add up the growth.  Once the heap may be past the size, they
 * add a new-hook, which tcmalloc calls after each allocation, outside its
 * locks.  At the first large allocation it removes itself and asks
 * tcmalloc for the heap's size; when it is past, the watch ends.  Other
 * code's anonymous mmaps count as growth too (Python's arenas): they only
 * make the new-hook look early, and the count starts again from the heap's
 * real size. */
#include "tcwatch.h"

#include <gperftools/malloc_hook_c.h>
#include <sys/mman.h>

#include "release.h"
#include "tcprop.h"

static uint64_t limit;
static void (*on_large)(void);
static uint64_t heap_estimate; /* tcmalloc's heap at the last look, plus growth since */
static int armed;              /* the new-hook is in */
static int fired;

static void look(const void *p, size_t size);

static void grown(uint64_t bytes)
{
    if (__atomic_add_fetch(&heap_estimate, bytes, __ATOMIC_RELAXED) > limit &&
        !__atomic_exchange_n(&armed, 1, __ATOMIC_ACQ_REL))
        MallocHook_AddNewHook(look);
}

static void mmap_hook(const void *result, const void *start, size_t size, int prot, int flags, int fd, off_t offset)
{
    (void)start, (void)offset;
    if (result != MAP_FAILED && fd == -1 && (flags & MAP_ANONYMOUS) && (prot & PROT_WRITE))
        grown(size);
}

static void sbrk_hook(const void *result, ptrdiff_t increment)
{
    if (result != (void *)-1 && increment > 0)
        grown((uint64_t)increment);
}

static void stop_watching(void)
{
    MallocHook_RemoveMmapHook(mmap_hook);
    MallocHook_RemoveSbrkHook(sbrk_hook);
}

static void look(const void *p, size_t size)
{
    (void)p;
    if (size < FA_RELEASE_MIN || !__atomic_exchange_n(&armed, 0, __ATOMIC_ACQ_REL))
        return;
    MallocHook_RemoveNewHook(look);
    uint64_t heap = fa_tc_prop("generic.heap_size");
    if (heap <= limit) {
        __atomic_store_n(&heap_estimate, heap, __ATOMIC_RELAXED);
        return;
    }
    if (__atomic_exchange_n(&fired, 1, __ATOMIC_ACQ_REL))
        return;
    stop_watching();
    on_large();
}

void fa_tcwatch_start(uint64_t bytes, void (*large)(void))
{
    limit = bytes;
    on_large = large;
    armed = 0;
    fired = 0;
    uint64_t heap = fa_tc_prop("generic.heap_size");
    if (heap > limit) {
        __atomic_store_n(&fired, 1, __ATOMIC_RELEASE);
        large();
        return;
    }
    __atomic_store_n(&heap_estimate, heap, __ATOMIC_RELAXED);
    MallocHook_AddMmapHook(mmap_hook);
    MallocHook_AddSbrkHook(sbrk_hook);
    /* Grown between the look and the hooks: the next growth arms it. */
}

bool fa_tcwatch_fired(void) { return __atomic_load_n(&fired, __ATOMIC_ACQUIRE); }
