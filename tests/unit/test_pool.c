/* test_pool.c - the device pool without a device: chunk order, the
 * quarantine and its epochs, giving chunks back, and the waste on a
 * PyTorch-like segment trace. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "../../src/device/pool.h"
#include "../../src/device/ptrmap.h"

#define MiB ((size_t)1 << 20)
#define CHUNK (64 * MiB)

static fa_pool pool; /* large: keep it off the stack */

static void make_pool(int chunks)
{
    fa_pool_init(&pool, CHUNK);
    /* Chunks added out of order, at fake device addresses. */
    for (int i = chunks - 1; i >= 0; i--)
        assert_true(fa_pool_add_chunk(&pool, 0x700000000000ull + (uintptr_t)i * 4 * CHUNK));
}

static void test_lowest_chunk_first(void **state)
{
    (void)state;
    make_pool(3);
    assert_int_equal(pool.bytes, 3 * CHUNK);
    uintptr_t a;
    assert_true(fa_pool_alloc(&pool, 48 * MiB, &a));
    assert_int_equal(a, 0x700000000000ull);
    assert_true(fa_pool_alloc(&pool, 48 * MiB, &a));
    assert_int_equal(a, 0x700000000000ull + 4 * CHUNK); /* did not fit in the first */
    assert_true(fa_pool_alloc(&pool, 16 * MiB, &a));
    assert_int_equal(a, 0x700000000000ull + 48 * MiB); /* back in the first */
    assert_false(fa_pool_alloc(&pool, CHUNK + 1, &a)); /* larger than a chunk */
    assert_true(fa_pool_owns(&pool, a));
    assert_false(fa_pool_owns(&pool, 0x700000000000ull + CHUNK)); /* the gap between chunks */
    fa_pool_clear(&pool);
}

static void test_quarantine_epochs(void **state)
{
    (void)state;
    make_pool(1);
    uintptr_t a, b, c;
    size_t taken, req;
    assert_true(fa_pool_alloc(&pool, 32 * MiB, &a));
    assert_int_equal(fa_pool_free(&pool, a, &taken, &req), FA_POOL_FREED);
    assert_int_equal(taken, 32 * MiB);
    assert_int_equal(pool.quarantined, 32 * MiB);
    assert_int_equal(fa_pool_idle(&pool), CHUNK); /* counted free, as cudaMemGetInfo will */
    /* Quarantined bytes are not handed out again. */
    assert_false(fa_pool_alloc(&pool, 40 * MiB, &b));
    assert_int_equal(fa_pool_free(&pool, a, &taken, &req), FA_POOL_BAD_POINTER); /* double free */
    /* A sync begins; a block freed meanwhile waits for the next one. */
    uint32_t e = fa_pool_sync_begin(&pool);
    assert_true(fa_pool_alloc(&pool, 8 * MiB, &c));
    assert_int_equal(fa_pool_free(&pool, c, &taken, &req), FA_POOL_FREED);
    assert_int_equal(fa_pool_sync_end(&pool, e), 32 * MiB);
    assert_int_equal(pool.quarantined, 8 * MiB);
    assert_true(fa_pool_alloc(&pool, 32 * MiB, &b));
    assert_int_equal(b, a); /* reused only after the sync */
    assert_int_equal(fa_pool_sync_end(&pool, fa_pool_sync_begin(&pool)), 8 * MiB);
    assert_int_equal(pool.quarantined, 0);
    assert_int_equal(fa_pool_free(&pool, b + 512, &taken, &req), FA_POOL_BAD_POINTER);
    assert_int_equal(fa_pool_free(&pool, 0x1000, &taken, &req), FA_POOL_NOT_OURS);
    fa_pool_clear(&pool);
}

static void test_idle_chunks_given_back(void **state)
{
    (void)state;
    make_pool(3);
    uintptr_t a, base;
    size_t taken, req;
    assert_true(fa_pool_alloc(&pool, MiB, &a)); /* pins the first chunk */
    assert_true(fa_pool_take_idle_chunk(&pool, &base));
    assert_int_equal(base, 0x700000000000ull + 8 * CHUNK); /* the highest first */
    assert_true(fa_pool_take_idle_chunk(&pool, &base));
    assert_false(fa_pool_take_idle_chunk(&pool, &base)); /* the first holds a block */
    assert_int_equal(fa_pool_free(&pool, a, &taken, &req), FA_POOL_FREED);
    assert_false(fa_pool_take_idle_chunk(&pool, &base)); /* quarantined still pins it */
    fa_pool_sync_end(&pool, fa_pool_sync_begin(&pool));
    assert_true(fa_pool_take_idle_chunk(&pool, &base));
    assert_int_equal(pool.nchunks, 0);
    assert_int_equal(pool.bytes, 0);
    fa_pool_clear(&pool);
}

/* 20 MiB segments (PyTorch's for 1-10 MiB tensors) fill a 64 MiB chunk
 * three times; cudaMemGetInfo's count (fa_pool_idle) takes in only the
 * chunks that hold no live block, quarantined blocks included. */
static void test_segments_pack_and_idle_count(void **state)
{
    (void)state;
    make_pool(2);
    uintptr_t a[7];
    size_t taken, req;
    assert_int_equal(fa_pool_idle(&pool), 2 * CHUNK);
    for (int i = 0; i < 6; i++)
        assert_true(fa_pool_alloc(&pool, 20 * MiB, &a[i]));
    assert_false(fa_pool_alloc(&pool, 20 * MiB, &a[6]));
    assert_int_equal(pool.in_use, 120 * MiB);
    assert_int_equal(fa_pool_idle(&pool), 0); /* 8 MiB free, but pinned by live blocks */
    for (int i = 0; i < 3; i++)
        assert_int_equal(fa_pool_free(&pool, a[i], &taken, &req), FA_POOL_FREED);
    assert_int_equal(fa_pool_idle(&pool), CHUNK); /* the first chunk holds only quarantine */
    assert_int_equal(fa_pool_free(&pool, a[3], &taken, &req), FA_POOL_FREED);
    assert_int_equal(fa_pool_idle(&pool), CHUNK); /* the second still holds two */
    fa_pool_sync_end(&pool, fa_pool_sync_begin(&pool));
    assert_true(fa_pool_alloc(&pool, 2 * MiB, &a[0])); /* the first chunk's free tail */
    assert_true(a[0] < pool.chunks[0]->buddy.base + CHUNK);
    assert_int_equal(fa_pool_idle(&pool), 0);
    assert_int_equal(fa_pool_free(&pool, a[0], &taken, &req), FA_POOL_FREED);
    assert_int_equal(fa_pool_idle(&pool), CHUNK);
    for (int i = 4; i < 6; i++)
        assert_int_equal(fa_pool_free(&pool, a[i], &taken, &req), FA_POOL_FREED);
    assert_int_equal(fa_pool_idle(&pool), 2 * CHUNK);
    assert_int_equal(pool.in_use, 0);
    fa_pool_clear(&pool);
}

/* PyTorch's caching allocator asks cudaMalloc for 2 MiB segments (requests
 * up to 1 MiB), 20 MiB segments (1-10 MiB) and larger requests rounded up
 * to 2 MiB.  Waste = (taken - requested) / requested must stay <= 12.5%;
 * pure power-of-two blocks would give 60% on the 20 MiB segments. */
static void test_pytorch_trace_waste(void **state)
{
    (void)state;
    make_pool(16); /* 1 GiB */
    unsigned seed = 3;
    uint64_t requested = 0, pow2 = 0;
    int allocs = 0;
    for (;;) {
        seed = seed * 1103515245u + 12345u;
        size_t want = (size_t)(seed >> 8) % (40 * MiB) + 1; /* the tensor asked of PyTorch */
        size_t seg = want <= MiB ? 2 * MiB : want <= 10 * MiB ? 20 * MiB : (want + 2 * MiB - 1) / (2 * MiB) * (2 * MiB);
        uintptr_t a;
        if (!fa_pool_alloc(&pool, seg, &a))
            break;
        requested += seg;
        size_t p = 512;
        while (p < seg)
            p *= 2;
        pow2 += p;
        allocs++;
    }
    assert_true(allocs > 30);
    /* Segments fill the pool up to the first that fits nowhere: 7/8 at least
     * (aligned placement alone strands the tails: 69% on this trace). */
    assert_true(requested >= pool.bytes / 8 * 7);
    assert_int_equal(pool.requested, requested);
    double waste = (double)(pool.in_use - pool.requested) / (double)pool.requested;
    double waste_pow2 = (double)(pow2 - requested) / (double)requested;
    print_message("PyTorch-like trace: %d segments, %.1f MiB, waste %.3f%% (pure power-of-two rounding: %.1f%%)\n",
                  allocs, (double)requested / MiB, 100 * waste, 100 * waste_pow2);
    assert_true(waste <= 0.125);
    assert_true(waste_pow2 > 0.125); /* the trace is one where rounding alone would fail */
    fa_pool_clear(&pool);
}

/* cudaMalloc's fast path (device.c) reads chunk_size without the pool's
 * lock, as here, while the pool may be set up or cleared: every write of it
 * is an atomic store.  A plain one is a data race, which a ThreadSanitizer
 * build (FA_SANITIZE=thread) reports and fails on; any build checks that
 * only whole values are read. */
static void *read_chunk_size(void *arg)
{
    uintptr_t odd = 0;
    for (int i = 0; i < 200000; i++) {
        size_t v = __atomic_load_n(&pool.chunk_size, __ATOMIC_ACQUIRE);
        odd += v != CHUNK && v != 2 * CHUNK;
    }
    (void)arg;
    return (void *)odd;
}

static void test_chunk_size_read_without_lock(void **state)
{
    (void)state;
    fa_pool_init(&pool, CHUNK);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, read_chunk_size, NULL), 0);
    for (int i = 0; i < 20000; i++) {
        fa_pool_init(&pool, i % 2 ? CHUNK : 2 * CHUNK);
        fa_pool_clear(&pool);
    }
    void *odd;
    assert_int_equal(pthread_join(t, &odd), 0);
    assert_null(odd);
    fa_pool_clear(&pool);
}

static void test_ptrmap(void **state)
{
    (void)state;
    fa_ptrmap m = {0};
    for (uintptr_t i = 1; i <= 10000; i++)
        assert_true(fa_ptrmap_put(&m, i << 12, (int)(i % 3), i));
    int dev;
    size_t size;
    for (uintptr_t i = 1; i <= 10000; i += 2) {
        assert_true(fa_ptrmap_take(&m, i << 12, &dev, &size));
        assert_int_equal(dev, (int)(i % 3));
        assert_int_equal(size, i);
    }
    assert_false(fa_ptrmap_take(&m, 1 << 12, &dev, &size));
    assert_int_equal(m.live, 5000);
    fa_ptrmap_drop_device(&m, 0);
    assert_false(fa_ptrmap_take(&m, (uintptr_t)6 << 12, &dev, &size)); /* device 0 */
    assert_true(fa_ptrmap_take(&m, (uintptr_t)4 << 12, &dev, &size));  /* device 1 */
    fa_ptrmap_clear(&m);
    assert_false(fa_ptrmap_take(&m, (uintptr_t)8 << 12, &dev, &size));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lowest_chunk_first),    cmocka_unit_test(test_quarantine_epochs),
        cmocka_unit_test(test_idle_chunks_given_back), cmocka_unit_test(test_pytorch_trace_waste),
        cmocka_unit_test(test_chunk_size_read_without_lock), cmocka_unit_test(test_ptrmap),
        cmocka_unit_test(test_segments_pack_and_idle_count),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
