/* test_vmpool.c - the pool of physical pieces without a device: placement,
 * backing per granule, access per run, the quarantine, idle pieces reused
 * before new ones are created, large blocks in pieces of their own, and
 * what fragmentation can and cannot pin.  The driver is a strict fake. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "../../src/device/vmpool.h"

#define MiB ((size_t)1 << 20)
#define G FA_VM_GRANULE
#define BASE ((uintptr_t)0x7f0000000000ull)
#define ZONE ((size_t)512 * MiB)

/* ---- a strict fake driver --------------------------------------------------- */

enum { MAXH = 4096, MAXM = 4096 };
static struct {
    uint64_t capacity, used;
    struct {
        size_t bytes;
        int live, maps;
    } h[MAXH];
    int nh;
    struct {
        uintptr_t addr;
        size_t bytes;
        uint64_t handle;
        int access;
    } m[MAXM];
    int nm;
    int creates, maps, unmaps, releases, accesses;
    int fail_access;
    int violations; /* calls the real driver would refuse */
} drv_state;

static int find_map(uintptr_t a)
{
    for (int i = 0; i < drv_state.nm; i++)
        if (drv_state.m[i].bytes && a >= drv_state.m[i].addr && a < drv_state.m[i].addr + drv_state.m[i].bytes)
            return i;
    return -1;
}

static int f_create(void *ctx, size_t bytes, uint64_t *h)
{
    (void)ctx;
    drv_state.creates++;
    if (bytes % G || drv_state.used + bytes > drv_state.capacity || drv_state.nh == MAXH)
        return 2;
    drv_state.used += bytes;
    drv_state.h[drv_state.nh].bytes = bytes;
    drv_state.h[drv_state.nh].live = 1;
    *h = (uint64_t)drv_state.nh++ + 100;
    return 0;
}

static int f_release(void *ctx, uint64_t h)
{
    (void)ctx;
    drv_state.releases++;
    int i = (int)(h - 100);
    if (i < 0 || i >= drv_state.nh || !drv_state.h[i].live || drv_state.h[i].maps) {
        drv_state.violations++;
        return 1;
    }
    drv_state.h[i].live = 0;
    drv_state.used -= drv_state.h[i].bytes;
    return 0;
}

static int f_map(void *ctx, uintptr_t a, size_t bytes, uint64_t h)
{
    (void)ctx;
    drv_state.maps++;
    int i = (int)(h - 100);
    if (a % G || bytes % G || i < 0 || i >= drv_state.nh || !drv_state.h[i].live || drv_state.h[i].bytes != bytes ||
        a < BASE || a + bytes > BASE + 2 * ZONE || drv_state.nm == MAXM) {
        drv_state.violations++;
        return 1;
    }
    for (uintptr_t c = a; c < a + bytes; c += G)
        if (find_map(c) >= 0) {
            drv_state.violations++;
            return 1;
        }
    drv_state.m[drv_state.nm].addr = a;
    drv_state.m[drv_state.nm].bytes = bytes;
    drv_state.m[drv_state.nm].handle = h;
    drv_state.m[drv_state.nm].access = 0;
    drv_state.nm++;
    drv_state.h[i].maps++;
    return 0;
}

static int f_unmap(void *ctx, uintptr_t a, size_t bytes)
{
    (void)ctx;
    drv_state.unmaps++;
    int i = find_map(a);
    if (i < 0 || drv_state.m[i].addr != a || drv_state.m[i].bytes != bytes) { /* whole mappings only */
        drv_state.violations++;
        return 1;
    }
    drv_state.h[drv_state.m[i].handle - 100].maps--;
    drv_state.m[i].bytes = 0;
    return 0;
}

static int f_access(void *ctx, uintptr_t a, size_t bytes)
{
    (void)ctx;
    drv_state.accesses++;
    if (drv_state.fail_access)
        return 1;
    for (uintptr_t c = a; c < a + bytes;) {
        int i = find_map(c);
        if (i < 0 || drv_state.m[i].addr != c) {
            drv_state.violations++;
            return 1;
        }
        drv_state.m[i].access = 1;
        c += drv_state.m[i].bytes;
    }
    return 0;
}

static const fa_vm_driver drv = {f_create, f_release, f_map, f_unmap, f_access};

/* Every byte of [a, a+n) mapped with access. */
static int reachable(uintptr_t a, size_t n)
{
    for (uintptr_t c = a & ~(uintptr_t)(G - 1); c < a + n; c += G) {
        int i = find_map(c);
        if (i < 0 || !drv_state.m[i].access)
            return 0;
    }
    return 1;
}

static fa_vm vm;

static int setup(void **state)
{
    (void)state;
    memset(&drv_state, 0, sizeof drv_state);
    drv_state.capacity = 256 * MiB;
    assert_true(fa_vm_init(&vm, BASE, ZONE));
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    fa_vm_release_all(&vm, &drv, NULL);
    assert_int_equal(drv_state.used, 0);
    assert_int_equal(drv_state.violations, 0);
    fa_vm_destroy(&vm);
    return 0;
}

static uintptr_t take(size_t n)
{
    uintptr_t a = 0;
    unsigned created;
    assert_int_equal(fa_vm_alloc(&vm, n, true, &drv, NULL, &a, &created), FA_VM_OK);
    assert_true(reachable(a, n));
    assert_int_equal(fa_vm_check(&vm), 0);
    return a;
}

static void give(uintptr_t a)
{
    size_t taken, req;
    assert_int_equal(fa_vm_free(&vm, a, &taken, &req), FA_VM_FREED);
}

static void sync_all(void) { fa_vm_sync_end(&vm, fa_vm_sync_begin(&vm)); }

/* ---- tests ---------------------------------------------------------------------- */

static void test_zone_size(void **state)
{
    (void)state;
    assert_int_equal(fa_vm_zone_for(1ull << 30), 2ull << 30);
    assert_int_equal(fa_vm_zone_for(80ull << 30), 256ull << 30); /* an 80 GB card */
    assert_int_equal(fa_vm_zone_for(1), 128 * MiB);
    assert_int_equal(fa_vm_zone_for(1ull << 50), 1ull << 40);
}

static void test_small_share_a_granule(void **state)
{
    (void)state;
    uintptr_t a = take(MiB);
    assert_int_equal(drv_state.creates, 1);
    assert_int_equal(drv_state.accesses, 1);
    uintptr_t b = take(512 * 1024);
    assert_int_equal(drv_state.creates, 1); /* same granule: no driver call */
    assert_int_equal(drv_state.maps, 1);
    assert_int_equal(a / G, b / G);
    assert_int_equal(vm.mapped, G);
    assert_int_equal(vm.requested, MiB + 512 * 1024);
}

static void test_access_once_per_run(void **state)
{
    (void)state;
    uintptr_t a = take(20 * MiB);
    assert_int_equal(a % G, 0);
    assert_int_equal(drv_state.creates, 10); /* 2 MiB pieces: 20 MiB costs 20 MiB */
    assert_int_equal(drv_state.maps, 10);
    assert_int_equal(drv_state.accesses, 1); /* one range */
    assert_int_equal(vm.mapped, 20 * MiB);
    assert_int_equal(vm.in_use, 20 * MiB);
}

static void test_quarantine(void **state)
{
    (void)state;
    uintptr_t a = take(20 * MiB);
    give(a);
    assert_int_equal(vm.quarantined, 20 * MiB);
    assert_int_equal(vm.idle, 0); /* not idle before the device caught up */
    assert_int_equal(fa_vm_release_idle(&vm, 0, true, &drv, NULL), 0);
    uintptr_t b = take(20 * MiB);
    assert_true(b != a); /* not handed out again */
    assert_int_equal(drv_state.creates, 20);
    uint32_t e = fa_vm_sync_begin(&vm);
    give(b); /* freed after the sync began: stays */
    assert_int_equal(fa_vm_sync_end(&vm, e), 20 * MiB);
    assert_int_equal(vm.quarantined, 20 * MiB);
    assert_int_equal(vm.idle, 20 * MiB);
    assert_int_equal(vm.pieces_idle, 10);
    uintptr_t c = take(20 * MiB);
    assert_int_equal(c, a); /* reused, no driver call */
    assert_int_equal(drv_state.creates, 20);
    assert_int_equal(vm.idle, 0);
    assert_int_equal(fa_vm_free(&vm, a, &(size_t){0}, &(size_t){0}), FA_VM_FREED);
    assert_int_equal(fa_vm_free(&vm, a, &(size_t){0}, &(size_t){0}), FA_VM_BAD_POINTER); /* double free */
    assert_int_equal(fa_vm_free(&vm, a + 512, &(size_t){0}, &(size_t){0}), FA_VM_BAD_POINTER);
    assert_int_equal(fa_vm_free(&vm, BASE - 4096, &(size_t){0}, &(size_t){0}), FA_VM_NOT_OURS);
    assert_int_equal(fa_vm_check(&vm), 0);
}

static void test_idle_pieces_before_new_ones(void **state)
{
    (void)state;
    uintptr_t a = take(2 * MiB), b = take(2 * MiB);
    give(a);
    sync_all();
    assert_int_equal(vm.pieces_idle, 1);
    uintptr_t c = take(4 * MiB); /* placed on granules with no piece */
    assert_true(c / G != a / G);
    assert_int_equal(vm.stolen, 1); /* a's piece moved here... */
    assert_int_equal(drv_state.creates, 3); /* ...and only one was created */
    assert_int_equal(vm.mapped, 6 * MiB);
    assert_false(reachable(a, 1)); /* a's granule is unmapped */
    (void)b;
}

static void test_may_create(void **state)
{
    (void)state;
    uintptr_t a = 0;
    unsigned created;
    assert_int_equal(fa_vm_alloc(&vm, MiB, false, &drv, NULL, &a, &created), FA_VM_NO_MEMORY);
    assert_int_equal(drv_state.creates, 0);
    assert_int_equal(vm.in_use, 0);
    assert_int_equal(fa_vm_check(&vm), 0);
}

static void test_large_blocks(void **state)
{
    (void)state;
    uintptr_t a = take(100 * MiB + 1);
    assert_int_equal(drv_state.creates, 1); /* one piece */
    assert_int_equal(vm.mapped, 102 * MiB);
    assert_int_equal(vm.requested, 100 * MiB + 1);
    assert_true(a >= BASE + ZONE);
    size_t taken, req;
    assert_int_equal(fa_vm_free(&vm, a, &taken, &req), FA_VM_FREED);
    assert_int_equal(taken, 102 * MiB);
    assert_int_equal(req, 100 * MiB + 1);
    sync_all();
    assert_int_equal(vm.idle, 102 * MiB);
    uintptr_t b = take(101 * MiB);
    assert_int_equal(b, a);
    assert_int_equal(drv_state.creates, 1); /* the same piece, no driver call */
    give(b);
    sync_all();
    uintptr_t c = take(80 * MiB); /* another size where the idle piece lies: replaced */
    assert_int_equal(c, a);
    assert_int_equal(drv_state.creates, 2);
    assert_int_equal(drv_state.releases, 1);
    assert_int_equal(vm.mapped, 80 * MiB);
}

/* Fill the "device" with 2 MiB blocks, keep one in 8, free the rest: only
 * the kept blocks' pieces stay, so the largest block is what the driver
 * has left. */
static void test_fragmentation_pins_nothing(void **state)
{
    (void)state;
    uintptr_t blocks[128];
    int n = 0;
    uintptr_t a;
    unsigned created;
    while (n < 128 && fa_vm_alloc(&vm, 2 * MiB, true, &drv, NULL, &a, &created) == FA_VM_OK)
        blocks[n++] = a;
    assert_int_equal(n, 128); /* 256 MiB of capacity */
    for (int i = 0; i < n; i++)
        if (i % 8)
            give(blocks[i]);
    sync_all();
    size_t want = 256 * MiB - 16 * 2 * MiB;
    assert_int_equal(fa_vm_alloc(&vm, want, true, &drv, NULL, &a, &created), FA_VM_NO_MEMORY);
    assert_int_equal(fa_vm_check(&vm), 0);
    assert_int_equal(fa_vm_release_idle(&vm, 0, true, &drv, NULL), 112); /* under pressure: every idle piece */
    assert_int_equal(vm.mapped, 32 * MiB);
    assert_int_equal(fa_vm_alloc(&vm, want, true, &drv, NULL, &a, &created), FA_VM_OK);
    assert_true(reachable(a, want));
    for (int i = 0; i < n; i += 8)
        assert_true(reachable(blocks[i], 2 * MiB)); /* the kept blocks are untouched */
    assert_int_equal(fa_vm_check(&vm), 0);
}

static void test_release_keeps(void **state)
{
    (void)state;
    uintptr_t a = take(40 * MiB);
    give(a);
    sync_all();
    assert_int_equal(fa_vm_release_idle(&vm, 16 * MiB, false, &drv, NULL), 0); /* large ones only: none */
    assert_int_equal(fa_vm_release_idle(&vm, 16 * MiB, true, &drv, NULL), 12);
    assert_int_equal(vm.mapped, 16 * MiB);
    assert_int_equal(drv_state.used, 16 * MiB);
    assert_int_equal(fa_vm_check(&vm), 0);
}

static void test_access_failure_leaves_nothing(void **state)
{
    (void)state;
    drv_state.fail_access = 1;
    uintptr_t a;
    unsigned created;
    assert_int_equal(fa_vm_alloc(&vm, 6 * MiB, true, &drv, NULL, &a, &created), FA_VM_NO_MEMORY);
    assert_int_equal(fa_vm_alloc(&vm, 70 * MiB, true, &drv, NULL, &a, &created), FA_VM_NO_MEMORY);
    assert_int_equal(vm.mapped, 0);
    assert_int_equal(drv_state.used, 0);
    assert_int_equal(vm.in_use, 0);
    assert_int_equal(fa_vm_check(&vm), 0);
    drv_state.fail_access = 0;
    take(6 * MiB);
}

static void test_grant_all(void **state)
{
    (void)state;
    take(4 * MiB);
    take(70 * MiB);
    int before = drv_state.accesses;
    assert_int_equal(fa_vm_grant_all(&vm, &drv, NULL), 0);
    assert_int_equal(drv_state.accesses - before, 3); /* per piece: two small, one large */
}

/* Small blocks out of the quarantine wait whole for the next request of
 * their size; their pieces are idle meanwhile (released under pressure,
 * backed again when the block is reused). */
static void test_reuse_cache(void **state)
{
    (void)state;
    uintptr_t a = take(20 * MiB);
    give(a);
    sync_all();
    assert_int_equal(vm.cached, 20 * MiB);
    assert_int_equal(vm.idle, 20 * MiB); /* a cached block's pieces are idle */
    uintptr_t b = take(20 * MiB - 4096); /* fewer units: placed anew, on a's idle pieces moved there */
    assert_true(b != a);
    assert_int_equal(vm.stolen, 10);
    give(b);
    sync_all();
    assert_int_equal(vm.cached, 40 * MiB - 4096);
    assert_int_equal(fa_vm_release_idle(&vm, 0, true, &drv, NULL), 10); /* pressure: every idle piece */
    assert_int_equal(vm.mapped, 0);
    int creates = drv_state.creates;
    uintptr_t c = take(20 * MiB);
    assert_int_equal(c, a);                            /* the cached block... */
    assert_int_equal(drv_state.creates, creates + 10); /* ...backed again */
    assert_int_equal(vm.cached, 20 * MiB - 4096);
    assert_int_equal(fa_vm_free(&vm, b, &(size_t){0}, &(size_t){0}), FA_VM_BAD_POINTER); /* cached is not live */
}

/* Cached blocks of one size whose pieces went back (idle pieces released)
 * beside one still backed: ready memory (no driver call allowed) is the
 * backed one, wherever it sits in the cache. */
static void test_cache_prefers_backed(void **state)
{
    (void)state;
    uintptr_t l = take(MiB), c = take(MiB); /* c shares a granule with the live l */
    uintptr_t a = take(MiB), b = take(MiB); /* a granule of their own */
    assert_int_equal(a >> 21, b >> 21);
    assert_true(c >> 21 == l >> 21 && c >> 21 != a >> 21);
    give(c), give(a), give(b);
    sync_all(); /* cached: b, a, c (the last freed first) */
    assert_int_equal(fa_vm_release_idle(&vm, 0, true, &drv, NULL), 1); /* a's and b's granule */
    uintptr_t got = 0;
    unsigned created = 0;
    int maps = drv_state.maps;
    assert_int_equal(fa_vm_alloc(&vm, MiB, false, NULL, NULL, &got, &created), FA_VM_OK);
    assert_int_equal(got, c); /* the backed one, third in the cache */
    assert_int_equal(drv_state.maps, maps);
    assert_int_equal(fa_vm_check(&vm), 0);
}

/* What the next synchronisation makes idle (cudaMemGetInfo counts it as
 * free): whole granules whose every taken byte is quarantined, and large
 * blocks' pieces; never a granule a live neighbour pins. */
static void test_reclaimable(void **state)
{
    (void)state;
    uintptr_t a = take(MiB), b = take(MiB);
    assert_int_equal(a / G, b / G);
    give(a);
    assert_int_equal(vm.quarantined, MiB);
    assert_int_equal(vm.reclaimable, 0); /* b pins the granule */
    assert_int_equal(fa_vm_check(&vm), 0);
    give(b);
    assert_int_equal(vm.reclaimable, G);
    assert_int_equal(fa_vm_check(&vm), 0);
    sync_all();
    assert_int_equal(vm.reclaimable, 0);
    assert_int_equal(vm.idle, G); /* as counted */

    uintptr_t c = take(MiB); /* alone in its granule: all of it comes back */
    give(c);
    assert_int_equal(vm.reclaimable, G);
    sync_all();
    assert_int_equal(vm.idle, G);

    /* A block over two granules, a live neighbour in the second (a size
     * the reuse cache does not hold: placed on backed free space). */
    uintptr_t d = take(3 * MiB), e = take(MiB / 2);
    assert_int_equal(e / G, (d + 3 * MiB - 1) / G);
    assert_int_not_equal(d / G, e / G);
    give(d);
    assert_int_equal(vm.reclaimable, G);
    assert_int_equal(fa_vm_check(&vm), 0);
    uint32_t ep = fa_vm_sync_begin(&vm);
    give(e); /* after the sync began: still waits */
    assert_int_equal(vm.reclaimable, 2 * G);
    fa_vm_sync_end(&vm, ep);
    assert_int_equal(vm.reclaimable, G); /* e's granule, wholly quarantined now */
    assert_int_equal(vm.idle, G);
    assert_int_equal(fa_vm_check(&vm), 0);
    sync_all();

    uintptr_t f = take(64 * MiB); /* large: a piece of its own */
    give(f);
    assert_int_equal(vm.reclaimable, 64 * MiB);
    assert_int_equal(fa_vm_check(&vm), 0);
    sync_all();
    assert_int_equal(vm.reclaimable, 0);
    assert_int_equal(fa_vm_check(&vm), 0);
}

/* Random takes, frees and synchronisations (one beginning before some
 * frees and ending after): every structure and count, reclaimable
 * included, stays consistent. */
static void test_random_consistency(void **state)
{
    (void)state;
    enum { N = 64 };
    uintptr_t live[N] = {0};
    unsigned seed = 12345;
    uint32_t ep = 0;
    bool open = false;
    for (int step = 0; step < 4000; step++) {
        seed = seed * 1103515245u + 12345u;
        unsigned r = (seed >> 8) % 100, i = (seed >> 16) % N;
        if (r < 45 && !live[i]) {
            seed = seed * 1103515245u + 12345u;
            size_t n = (seed >> 8) % 10 == 0 ? (64 + (seed >> 12) % 8) * MiB : 512 + (seed >> 12) % (3 * MiB);
            unsigned created;
            if (fa_vm_alloc(&vm, n, true, &drv, NULL, &live[i], &created) != FA_VM_OK) {
                live[i] = 0;
                fa_vm_release_idle(&vm, 0, true, &drv, NULL);
            }
        } else if (r < 90 && live[i]) {
            give(live[i]);
            live[i] = 0;
        } else if (r >= 90 && !open) {
            ep = fa_vm_sync_begin(&vm);
            open = true;
        } else if (r >= 90) {
            fa_vm_sync_end(&vm, ep);
            open = false;
        }
        assert_int_equal(fa_vm_check(&vm), 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_zone_size),
        cmocka_unit_test_setup_teardown(test_small_share_a_granule, setup, teardown),
        cmocka_unit_test_setup_teardown(test_access_once_per_run, setup, teardown),
        cmocka_unit_test_setup_teardown(test_quarantine, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idle_pieces_before_new_ones, setup, teardown),
        cmocka_unit_test_setup_teardown(test_may_create, setup, teardown),
        cmocka_unit_test_setup_teardown(test_large_blocks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fragmentation_pins_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_release_keeps, setup, teardown),
        cmocka_unit_test_setup_teardown(test_access_failure_leaves_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_grant_all, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reuse_cache, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cache_prefers_backed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reclaimable, setup, teardown),
        cmocka_unit_test_setup_teardown(test_random_consistency, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
