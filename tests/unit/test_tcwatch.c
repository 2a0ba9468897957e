/* test_tcwatch.c - noticing that a tcmalloc serving malloc ahead of
 * forgealloc grew large (tcwatch.c), against a stand-in for tcmalloc's
 * hooks and heap size: the test grows the heap and makes allocations. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include <cmocka.h>
#include <gperftools/malloc_hook_c.h>

#include "../../src/host/release.h"
#include "../../src/host/tcwatch.h"

#define MB ((uint64_t)1 << 20)

/* ---- tcmalloc's hooks and heap size ---------------------------------- */

static uint64_t heap;
static MallocHook_NewHook new_hook;
static MallocHook_MmapHook mmap_hook;
static MallocHook_SbrkHook sbrk_hook;
static int new_adds;

int MallocExtension_GetNumericProperty(const char *name, size_t *value)
{
    if (strcmp(name, "generic.heap_size") != 0)
        return 0;
    *value = heap;
    return 1;
}

/* One slot each, as tcmalloc's lists would hold this one hook. */
#define HOOK_PAIR(Name, Type, slot)                                                                        \
    int MallocHook_Add##Name##Hook(Type h)                                                                 \
    {                                                                                                      \
        assert_null(slot);                                                                                 \
        slot = h;                                                                                          \
        return 1;                                                                                          \
    }                                                                                                      \
    int MallocHook_Remove##Name##Hook(Type h)                                                              \
    {                                                                                                      \
        if (slot != h)                                                                                     \
            return 0;                                                                                      \
        slot = NULL;                                                                                       \
        return 1;                                                                                          \
    }
HOOK_PAIR(Mmap, MallocHook_MmapHook, mmap_hook)
HOOK_PAIR(Sbrk, MallocHook_SbrkHook, sbrk_hook)

int MallocHook_AddNewHook(MallocHook_NewHook h)
{
    assert_null(new_hook); /* never twice */
    new_hook = h;
    new_adds++;
    return 1;
}

int MallocHook_RemoveNewHook(MallocHook_NewHook h)
{
    if (new_hook != h)
        return 0;
    new_hook = NULL;
    return 1;
}

/* tcmalloc took `n` more bytes (sbrk), or someone mapped them. */
static void grow_sbrk(uint64_t n)
{
    heap += n;
    if (sbrk_hook)
        sbrk_hook((void *)0x1000, (ptrdiff_t)n);
}

static void other_mmap(uint64_t n, int prot, int flags, int fd)
{
    if (mmap_hook)
        mmap_hook((void *)0x2000, NULL, n, prot, flags, fd, 0);
}

static void allocate(size_t n)
{
    if (new_hook)
        new_hook((void *)0x3000, n);
}

static int fired;
static void large(void) { fired++; }

static int reset(void **state)
{
    (void)state;
    heap = 0;
    new_hook = NULL;
    mmap_hook = NULL;
    sbrk_hook = NULL;
    new_adds = 0;
    fired = 0;
    return 0;
}

/* ---- tests --------------------------------------------------------------- */

/* A heap already past the size: at once, and nothing is hooked. */
static void test_large_at_start(void **state)
{
    (void)state;
    heap = 40 * MB;
    fa_tcwatch_start(32 * MB, large);
    assert_int_equal(fired, 1);
    assert_true(fa_tcwatch_fired());
    assert_null(mmap_hook);
    assert_null(sbrk_hook);
    assert_null(new_hook);
}

/* Growth up to the size costs the allocations nothing (no new-hook); past
 * it, the first large allocation ends the watch, once; small ones before
 * it (the dynamic loader's among them) never do. */
static void test_growth(void **state)
{
    (void)state;
    heap = 4 * MB;
    fa_tcwatch_start(32 * MB, large);
    assert_int_equal(fired, 0);
    assert_non_null(sbrk_hook);
    for (int i = 0; i < 28; i++)
        grow_sbrk(MB);
    assert_null(new_hook); /* 32 MiB: not past */
    grow_sbrk(MB);
    grow_sbrk(MB);
    assert_non_null(new_hook);
    assert_int_equal(new_adds, 1);
    allocate(64);
    allocate(FA_RELEASE_MIN - 1);
    assert_int_equal(fired, 0);
    allocate(FA_RELEASE_MIN);
    assert_int_equal(fired, 1);
    assert_null(new_hook);
    assert_null(sbrk_hook);
    assert_null(mmap_hook);
    allocate(FA_RELEASE_MIN);
    grow_sbrk(100 * MB);
    assert_int_equal(fired, 1);
}

/* Another library's anonymous writable mappings count as growth, but the
 * look finds tcmalloc's heap small and counts again from its real size;
 * file mappings, read-only ones and failed ones do not count at all. */
static void test_other_mappings(void **state)
{
    (void)state;
    heap = 4 * MB;
    fa_tcwatch_start(32 * MB, large);
    other_mmap(64 * MB, PROT_READ, MAP_PRIVATE, 7);
    other_mmap(64 * MB, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1);
    if (mmap_hook)
        mmap_hook(MAP_FAILED, NULL, 64 * MB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_null(new_hook);
    other_mmap(40 * MB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1);
    assert_non_null(new_hook);
    allocate(FA_RELEASE_MIN);
    assert_int_equal(fired, 0); /* tcmalloc's heap is 4 MiB */
    assert_null(new_hook);
    grow_sbrk(20 * MB); /* 24 MiB now, whatever was mapped before */
    assert_null(new_hook);
    grow_sbrk(10 * MB);
    assert_non_null(new_hook);
    allocate(FA_RELEASE_MIN);
    assert_int_equal(fired, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_large_at_start, reset),
        cmocka_unit_test_setup(test_growth, reset),
        cmocka_unit_test_setup(test_other_mappings, reset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
