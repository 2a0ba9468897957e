/* test_buddy.c - the buddy core: split, merge, alignment, exhaustion,
 * tail trimming, placement in runs of free blocks, and a random churn over
 * real memory that proves no two live blocks overlap. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../../src/device/buddy.h"

#define UNIT_SHIFT 9
#define KiB ((size_t)1024)
#define MiB (1024 * KiB)

static void test_split_and_merge(void **state)
{
    (void)state;
    fa_buddy b;
    assert_true(fa_buddy_init(&b, 0x100000000ull, UNIT_SHIFT, 10)); /* 1024 units = 512 KiB */
    assert_true(fa_buddy_idle(&b));
    assert_int_equal(fa_buddy_largest(&b), 512 * KiB);
    uintptr_t a, c;
    assert_true(fa_buddy_alloc(&b, 1, &a));
    assert_int_equal(a, 0x100000000ull);              /* lowest block first */
    assert_int_equal(fa_buddy_largest(&b), 256 * KiB); /* the top block was split */
    assert_true(fa_buddy_alloc(&b, 512, &c));
    assert_int_equal(c, a + 512);                      /* its buddy */
    assert_int_equal(fa_buddy_check(&b), 0);
    fa_buddy_free_unit(&b, fa_buddy_find(&b, a));
    fa_buddy_free_unit(&b, fa_buddy_find(&b, c));
    assert_true(fa_buddy_idle(&b)); /* merged all the way up */
    assert_int_equal(fa_buddy_largest(&b), 512 * KiB);
    assert_int_equal(fa_buddy_check(&b), 0);
    fa_buddy_destroy(&b);
}

static void test_find_and_bad_pointers(void **state)
{
    (void)state;
    fa_buddy b;
    assert_true(fa_buddy_init(&b, 0x10000, UNIT_SHIFT, 8));
    uintptr_t a;
    assert_true(fa_buddy_alloc(&b, 5000, &a));
    uint32_t u = fa_buddy_find(&b, a);
    assert_int_not_equal(u, FA_BUDDY_NIL);
    assert_int_equal(fa_buddy_alloc_bytes(&b, u), 10 * 512); /* 5000 B -> 10 units */
    assert_int_equal(fa_buddy_requested(&b, u), 5000);
    assert_int_equal(fa_buddy_find(&b, a + 512), FA_BUDDY_NIL); /* interior */
    assert_int_equal(fa_buddy_find(&b, a + 1), FA_BUDDY_NIL);   /* misaligned */
    assert_int_equal(fa_buddy_find(&b, 0x100), FA_BUDDY_NIL);   /* outside */
    fa_buddy_hold(&b, u);
    assert_int_equal(fa_buddy_find(&b, a), FA_BUDDY_NIL); /* held: a second free is refused */
    fa_buddy_free_unit(&b, u);
    assert_true(fa_buddy_idle(&b));
    assert_int_equal(fa_buddy_find(&b, a), FA_BUDDY_NIL);
    assert_false(fa_buddy_alloc(&b, 0, &a));
    assert_false(fa_buddy_alloc(&b, 129 * 1024, &a)); /* more than the arena */
    fa_buddy_destroy(&b);
}

static void test_alignment(void **state)
{
    (void)state;
    fa_buddy b;
    assert_true(fa_buddy_init(&b, 0x7f0000000000ull, UNIT_SHIFT, 16)); /* 32 MiB */
    size_t sizes[] = {1, 513, 4096, 5000, 65536, 100000, MiB, 3 * MiB};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        uintptr_t a;
        assert_true(fa_buddy_alloc(&b, sizes[i], &a));
        size_t align = 512;
        while (align * 2 <= sizes[i])
            align *= 2;
        if ((a - b.base) % align != 0)
            fail_msg("%zu bytes at offset %#lx: not aligned to %zu", sizes[i], (unsigned long)(a - b.base), align);
    }
    assert_int_equal(fa_buddy_check(&b), 0);
    fa_buddy_destroy(&b);
}

static void test_exhaustion(void **state)
{
    (void)state;
    fa_buddy b;
    assert_true(fa_buddy_init(&b, 0x1000000, UNIT_SHIFT, 12));
    uintptr_t a;
    int n = 0;
    /* 3 units each take a 4-unit block and give the fourth back. */
    while (fa_buddy_alloc(&b, 3 * 512, &a))
        n++;
    assert_int_equal(n, 4096 / 4);
    assert_int_equal(b.free_units, 1024);
    assert_int_equal(fa_buddy_largest(&b), 512); /* single units, none adjacent */
    assert_int_equal(fa_buddy_check(&b), 0);
    for (int i = 0; i < 1024; i++)
        assert_true(fa_buddy_alloc(&b, 512, &a));
    assert_false(fa_buddy_alloc(&b, 512, &a));
    assert_int_equal(fa_buddy_largest(&b), 0);
    fa_buddy_destroy(&b);
}

static void test_tail_trimming(void **state)
{
    (void)state;
    /* 20 MiB in a 64 MiB arena takes 20 MiB, not 32: the 4 + 8 MiB tail
     * is free again, and so is the other 32 MiB half. */
    fa_buddy b;
    assert_true(fa_buddy_init(&b, 0x200000000ull, UNIT_SHIFT, 17)); /* 64 MiB */
    uintptr_t a, c, t[4];
    assert_true(fa_buddy_alloc(&b, 20 * MiB, &a));
    assert_int_equal((uint64_t)b.free_units << UNIT_SHIFT, 44 * MiB);
    assert_true(fa_buddy_alloc(&b, 20 * MiB, &c));
    assert_int_equal(c, a + 32 * MiB);
    /* What is left is the two tails, usable as they are: 8, 8, 4, 4 MiB. */
    assert_int_equal(fa_buddy_largest(&b), 8 * MiB);
    size_t tails[4] = {8 * MiB, 8 * MiB, 4 * MiB, 4 * MiB};
    for (int i = 0; i < 4; i++)
        assert_true(fa_buddy_alloc(&b, tails[i], &t[i]));
    assert_int_equal(b.free_units, 0);
    assert_int_equal(fa_buddy_check(&b), 0);
    fa_buddy_free_unit(&b, fa_buddy_find(&b, c));
    fa_buddy_free_unit(&b, fa_buddy_find(&b, a));
    for (int i = 0; i < 4; i++)
        fa_buddy_free_unit(&b, fa_buddy_find(&b, t[i]));
    assert_true(fa_buddy_idle(&b));
    assert_int_equal(fa_buddy_check(&b), 0);
    fa_buddy_destroy(&b);
}

/* Placement that may start inside trimmed tails: 20 MiB requests fill a
 * 64 MiB arena three times, a request with no aligned block left takes the
 * run that holds it, and frees of unaligned allocations merge back. */
static void test_fit_fills_tails(void **state)
{
    (void)state;
    fa_buddy b;
    const uintptr_t base = 0x200000000ull;
    assert_true(fa_buddy_init(&b, base, UNIT_SHIFT, 17)); /* 64 MiB */
    uintptr_t a[3], x;
    for (int i = 0; i < 3; i++) {
        assert_true(fa_buddy_alloc_fit(&b, 20 * MiB, &a[i]));
        assert_int_equal(a[i], base + (uintptr_t)i * 20 * MiB); /* packed, not at 32 MiB */
        assert_int_equal(fa_buddy_check(&b), 0);
    }
    assert_false(fa_buddy_alloc_fit(&b, 20 * MiB, &x));
    assert_int_equal((uint64_t)b.free_units << UNIT_SHIFT, 4 * MiB);
    /* The middle one freed: its space serves the same size again. */
    fa_buddy_free_unit(&b, fa_buddy_find(&b, a[1]));
    assert_int_equal(fa_buddy_check(&b), 0);
    assert_true(fa_buddy_alloc_fit(&b, 20 * MiB, &x));
    assert_int_equal(x, a[1]);
    /* A power of two takes its aligned block as fa_buddy_alloc does. */
    fa_buddy_free_unit(&b, fa_buddy_find(&b, x));
    assert_true(fa_buddy_alloc_fit(&b, 4 * MiB, &x));
    assert_int_equal(x, base + 20 * MiB); /* the freed 20 MiB left 4 + 8 + 8 MiB blocks */
    fa_buddy_free_unit(&b, fa_buddy_find(&b, x));
    for (int i = 0; i < 3; i += 2)
        fa_buddy_free_unit(&b, fa_buddy_find(&b, a[i]));
    assert_true(fa_buddy_idle(&b)); /* merged all the way up */
    assert_int_equal(fa_buddy_check(&b), 0);

    /* No block of 8 units is left: 5 units go to the run of 1 + 4 at unit 3. */
    fa_buddy_destroy(&b);
    assert_true(fa_buddy_init(&b, base, UNIT_SHIFT, 3)); /* 8 units */
    assert_true(fa_buddy_alloc_fit(&b, 3 * 512, &a[0]));
    assert_false(fa_buddy_alloc(&b, 5 * 512, &x)); /* no aligned block */
    assert_true(fa_buddy_alloc_fit(&b, 5 * 512 - 7, &x));
    assert_int_equal(x, base + 3 * 512);
    assert_int_equal(fa_buddy_requested(&b, fa_buddy_find(&b, x)), 5 * 512 - 7);
    assert_int_equal(b.free_units, 0);
    assert_int_equal(fa_buddy_check(&b), 0);
    fa_buddy_free_unit(&b, fa_buddy_find(&b, a[0]));
    assert_false(fa_buddy_alloc_fit(&b, 4 * 512, &a[1])); /* 3 free units, no run of 4 */
    fa_buddy_free_unit(&b, fa_buddy_find(&b, x));
    assert_true(fa_buddy_idle(&b));
    assert_int_equal(fa_buddy_check(&b), 0);
    fa_buddy_destroy(&b);
}

/* A churn over real memory: every live block is filled with its own tag
 * and checked before it is freed, so an overlap shows as a wrong tag.
 * Once with aligned placement, once with fa_buddy_alloc_fit. */
static void churn(bool fit)
{
    enum { ORDER = 14, SLOTS = 512, STEPS = 60000 };
    size_t arena = (size_t)1 << (ORDER + UNIT_SHIFT); /* 8 MiB */
    unsigned char *mem = aligned_alloc(4096, arena);
    assert_non_null(mem);
    fa_buddy b;
    assert_true(fa_buddy_init(&b, (uintptr_t)mem, UNIT_SHIFT, ORDER));
    struct {
        unsigned char *p;
        size_t n;
    } live[SLOTS] = {{0}};
    unsigned seed = 7;
    size_t requested = 0, taken = 0;
    for (int step = 0; step < STEPS; step++) {
        seed = seed * 1103515245u + 12345u;
        int i = (int)((seed >> 8) % SLOTS);
        if (live[i].p) {
            for (size_t k = 0; k < live[i].n; k += 97)
                if (live[i].p[k] != (unsigned char)i)
                    fail_msg("block %d overwritten at +%zu", i, k);
            uint32_t u = fa_buddy_find(&b, (uintptr_t)live[i].p);
            assert_int_not_equal(u, FA_BUDDY_NIL);
            requested -= live[i].n;
            taken -= fa_buddy_alloc_bytes(&b, u);
            fa_buddy_free_unit(&b, u);
            live[i].p = NULL;
        } else {
            seed = seed * 1103515245u + 12345u;
            size_t n = (seed >> 4) % (seed & 1 ? 2000 : 100000) + 1;
            uintptr_t a;
            if (!(fit ? fa_buddy_alloc_fit(&b, n, &a) : fa_buddy_alloc(&b, n, &a)))
                continue; /* full for this size: fine */
            live[i].p = (unsigned char *)a;
            live[i].n = n;
            memset(live[i].p, i, n);
            requested += n;
            taken += fa_buddy_alloc_bytes(&b, fa_buddy_find(&b, a));
        }
        if (step % 5000 == 0)
            assert_int_equal(fa_buddy_check(&b), 0);
    }
    assert_true(taken - requested < 512 * (size_t)SLOTS); /* under one unit of waste each */
    for (int i = 0; i < SLOTS; i++)
        if (live[i].p)
            fa_buddy_free_unit(&b, fa_buddy_find(&b, (uintptr_t)live[i].p));
    assert_true(fa_buddy_idle(&b));
    assert_int_equal(fa_buddy_check(&b), 0);
    fa_buddy_destroy(&b);
    free(mem);
}

static void test_churn_no_overlap(void **state)
{
    (void)state;
    churn(false);
}

static void test_churn_fit_no_overlap(void **state)
{
    (void)state;
    churn(true);
}

static void test_bad_shapes(void **state)
{
    (void)state;
    fa_buddy b;
    assert_false(fa_buddy_init(&b, 0, 3, 10));  /* unit below 16 B */
    assert_false(fa_buddy_init(&b, 0, 22, 10)); /* unit above 2 MiB */
    assert_false(fa_buddy_init(&b, 0, 9, 32));  /* more units than the indices hold */
}

/* Units of 2 MiB (the device pool's large zone): only sizes whose last
 * unit is short by less than 64 KiB, the slack field being 16 bits. */
static void test_large_units(void **state)
{
    (void)state;
    fa_buddy b;
    uintptr_t a;
    assert_true(fa_buddy_init(&b, 0x10000000, 21, 4));
    assert_false(fa_buddy_alloc(&b, (3u << 20), &a)); /* 1 MiB short of 2 units */
    assert_true(fa_buddy_alloc(&b, (4u << 20) - 100, &a));
    assert_int_equal(fa_buddy_requested(&b, fa_buddy_find(&b, a)), (4u << 20) - 100);
    assert_int_equal(fa_buddy_check(&b), 0);
    fa_buddy_destroy(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_and_merge), cmocka_unit_test(test_large_units), cmocka_unit_test(test_find_and_bad_pointers),
        cmocka_unit_test(test_alignment),       cmocka_unit_test(test_exhaustion),
        cmocka_unit_test(test_tail_trimming),   cmocka_unit_test(test_churn_no_overlap),
        cmocka_unit_test(test_bad_shapes),      cmocka_unit_test(test_fit_fills_tails),
        cmocka_unit_test(test_churn_fit_no_overlap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
