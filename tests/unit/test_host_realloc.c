/* test_host_realloc.c - realloc of large blocks and the release policy's
 * table of live large blocks (host.c over release.c), against a stand-in
 * for tcmalloc whose heap the test controls: every branch of realloc
 * leaves the table holding each live large block at its own size, also
 * when another thread is handed a moved block's old address before
 * realloc returns.  The stand-in's addresses are never dereferenced. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "../../src/core/options.h"
#include "../../src/host/grown.h"
#include "../../src/host/host.h"
#include "../../src/host/release.h"

#define KB ((size_t)1 << 10)
#define MB ((size_t)1 << 20)

/* ---- a stand-in for tcmalloc ------------------------------------------- */

/* Blocks at made-up, page-aligned addresses.  A freed block's address is
 * handed out again to the next request it can hold, as tcmalloc's page
 * heap does with a free span. */
#define PAGE ((size_t)8 * KB) /* tcmalloc's page */
#define MAX_BLOCKS 64
static struct block {
    uintptr_t p;
    size_t cap; /* the request rounded up to pages: what realloc may use in place */
    bool live;
} blocks[MAX_BLOCKS];
static int nblocks;
static uintptr_t next_addr;
static struct block *freed_last;
static bool fail_next;                  /* the next realloc that must move fails */
static void (*moved_freed)(uintptr_t);  /* runs once a moving realloc has freed the old address */

static struct block *find(uintptr_t p)
{
    for (int i = 0; i < nblocks; i++)
        if (blocks[i].p == p && blocks[i].live)
            return &blocks[i];
    return NULL;
}

static void *take(size_t n)
{
    size_t cap = (n + PAGE - 1) / PAGE * PAGE;
    struct block *b = freed_last;
    freed_last = NULL;
    if (!b || b->cap < cap) {
        assert_true(nblocks < MAX_BLOCKS);
        b = &blocks[nblocks++];
        b->p = next_addr;
        b->cap = cap;
        next_addr += (uintptr_t)64 * MB;
    }
    b->live = true;
    return (void *)b->p;
}

static void give_back(void *p)
{
    if (!p)
        return;
    struct block *b = find((uintptr_t)p);
    assert_non_null(b); /* a free of a block that is not live */
    b->live = false;
    freed_last = b;
}

void *tc_malloc(size_t n) { return take(n); }
void *tc_calloc(size_t n, size_t size) { return take(n * size); }
void *tc_memalign(size_t align, size_t n) { return (void)align, take(n); }
void *tc_new(size_t n) { return take(n); }
void *tc_new_nothrow(size_t n, const void *nt) { return (void)nt, take(n); }
void *tc_new_aligned(size_t n, size_t align) { return (void)align, take(n); }
void *tc_new_aligned_nothrow(size_t n, size_t align, const void *nt) { return (void)align, (void)nt, take(n); }
void tc_free(void *p) { give_back(p); }
void tc_delete(void *p) { give_back(p); }
void tc_delete_sized(void *p, size_t n) { (void)n, give_back(p); }
void tc_delete_aligned(void *p, size_t align) { (void)align, give_back(p); }
void tc_delete_sized_aligned(void *p, size_t n, size_t align) { (void)n, (void)align, give_back(p); }

/* ---- a stand-in for grown.c (tested on real mappings in test_grown) --- */

/* Off unless a test turns it on: growth then stays tcmalloc's, as the
 * other tests expect.  Grown blocks get made-up addresses of their own. */
static bool grown_on;
static uintptr_t grown_next = (uintptr_t)1 << 42;
static int grown_frees, grown_reallocs;

void *fa_grown_adopt(const void *p, size_t keep, size_t n)
{
    (void)p, (void)keep;
    if (!grown_on)
        return NULL;
    void *q = (void *)grown_next;
    grown_next += (uintptr_t)1 << 32;
    return fa_release_remember_mapped(q, n) ? q : NULL;
}
void *fa_grown_realloc(void *p, size_t old, size_t n, bool *to_tc)
{
    (void)old;
    *to_tc = false;
    grown_reallocs++;
    fa_release_resize(p, n | FA_RELEASE_MAPPED); /* resized in place */
    return p;
}
void fa_grown_free(void *p, size_t n) { (void)p, (void)n, grown_frees++; }
void fa_grown_advise_huge(void *p, size_t n) { (void)p, (void)n; }
size_t fa_grown_usable(size_t n) { return (n + 4095) & ~(size_t)4095; }
uint64_t fa_grown_bytes(void) { return 0; }

/* Blocks the many-blocks tests remember directly, with a size that follows
 * from the address, so tc_malloc_size can answer for them too.  It counts
 * how often it is asked for them (each is a block the tables did not
 * hold), and while `asked_barrier` is set, waits there before answering. */
#define MANY_BASE ((uintptr_t)1 << 44)
static size_t many_size(uintptr_t p) { return FA_RELEASE_MIN - 1 + (p / PAGE % 977 + 1) * PAGE; }
static size_t many_asked;
static pthread_barrier_t *asked_barrier;

size_t tc_malloc_size(void *p)
{
    if ((uintptr_t)p >= MANY_BASE) {
        __atomic_fetch_add(&many_asked, 1, __ATOMIC_RELAXED);
        if (asked_barrier)
            pthread_barrier_wait(asked_barrier);
        return many_size((uintptr_t)p);
    }
    struct block *b = find((uintptr_t)p);
    return b ? b->cap : 0;
}

/* tcmalloc's rule: in place while the new size is within the block and at
 * least half of it; otherwise allocate, copy, free the old block. */
void *tc_realloc(void *p, size_t n)
{
    if (!p)
        return take(n);
    if (n == 0) {
        give_back(p);
        return NULL;
    }
    struct block *b = find((uintptr_t)p);
    assert_non_null(b);
    if (n <= b->cap && n >= b->cap / 2)
        return p;
    if (fail_next) {
        fail_next = false;
        errno = ENOMEM;
        return NULL;
    }
    void *q = take(n);
    give_back(p);
    if (moved_freed)
        moved_freed((uintptr_t)p);
    return q;
}

int MallocExtension_GetNumericProperty(const char *name, size_t *value)
{
    (void)name;
    *value = 0;
    return 1;
}
void MallocExtension_ReleaseToSystem(size_t n) { (void)n; }
void MallocExtension_ReleaseFreeMemory(void) {}

/* ---- helpers --------------------------------------------------------- */

static int setup(void **state)
{
    (void)state;
    memset(blocks, 0, sizeof blocks);
    nblocks = 0;
    freed_last = NULL;
    fail_next = false;
    moved_freed = NULL;
    return 0;
}

/* The size the table holds for p (0: none), taken out of the table. */
static size_t table_take(void *p) { return fa_release_forget(p); }

/* ---- every branch of realloc ------------------------------------------ */

/* In place, the block keeps its whole span: nothing is freed or allocated,
 * the table keeps the larger size, and the release policy hears nothing
 * (no wake of the background thread). */
static int wakes;
static bool count_wake(bool start) { return (void)start, ++wakes, true; }

static void test_shrink_in_place(void **state)
{
    (void)state;
    fa_release_set_waker(count_wake);
    wakes = 0;
    void *p = fa_host_malloc_other(48 * MB, NULL);
    assert_ptr_equal(fa_host_realloc(p, 32 * MB, NULL), p);
    assert_int_equal(wakes, 0);
    assert_int_equal(table_take(p), 48 * MB);
    assert_int_equal(table_take(p), 0);
    fa_release_set_waker(NULL);
}

static void test_grow_in_place(void **state)
{
    (void)state;
    void *p = fa_host_malloc_other(3 * MB - 4 * KB, NULL); /* 3 MiB of pages */
    assert_ptr_equal(fa_host_realloc(p, 3 * MB, NULL), p);
    assert_int_equal(table_take(p), 3 * MB);
    assert_int_equal(table_take(p), 0);
}

static void test_move(void **state)
{
    (void)state;
    void *p = fa_host_malloc_other(1 * MB, NULL);
    void *q = fa_host_realloc(p, 3 * MB, NULL);
    assert_ptr_not_equal(q, p);
    assert_int_equal(table_take(p), 0);
    assert_int_equal(table_take(q), 3 * MB);
}

/* A realloc that fails leaves p allocated, and in the table. */
static void test_failure(void **state)
{
    (void)state;
    void *p = fa_host_malloc_other(2 * MB, NULL);
    fail_next = true;
    errno = 0;
    assert_null(fa_host_realloc(p, 8 * MB, NULL));
    assert_int_equal(errno, ENOMEM);
    assert_non_null(find((uintptr_t)p));
    assert_int_equal(table_take(p), 2 * MB);
}

/* Grown beyond its span to FA_GROWN_MIN or more, a block leaves tcmalloc
 * (its span freed there) for a mapping the table marks; realloc, usable
 * size, free and delete of it reach grown.c, never tcmalloc.  Smaller
 * growth and growth within the span stay tcmalloc's. */
static void test_grown_paths(void **state)
{
    (void)state;
    grown_on = true;
    grown_frees = grown_reallocs = 0;
    void *p = fa_host_malloc_other(2 * MB, NULL);
    void *w = fa_host_malloc_other(6 * MB + 1, NULL); /* within its span: in place, tcmalloc's */
    assert_ptr_equal(fa_host_realloc(w, 6 * MB + PAGE, NULL), w);
    assert_int_equal(fa_release_lookup(w), 6 * MB + PAGE);
    void *t = fa_host_realloc(p, FA_GROWN_MIN - PAGE, NULL); /* below the size: tcmalloc moves it */
    assert_true(t != p && find((uintptr_t)t) != NULL);
    assert_int_equal(fa_release_lookup(t), FA_GROWN_MIN - PAGE);
    void *q = fa_host_realloc(t, 8 * MB, NULL);
    assert_true((uintptr_t)q >= ((uintptr_t)1 << 42));
    assert_null(find((uintptr_t)t)); /* tcmalloc's span went back */
    assert_int_equal(fa_release_lookup(q), 8 * MB | FA_RELEASE_MAPPED);
    assert_int_equal(fa_host_usable_size(q), 8 * MB);
    assert_ptr_equal(fa_host_realloc(q, 12 * MB, NULL), q);
    assert_int_equal(grown_reallocs, 1);
    assert_int_equal(fa_release_lookup(q), 12 * MB | FA_RELEASE_MAPPED);
    fa_host_free(q, NULL);
    fa_host_free(w, NULL);
    assert_int_equal(grown_frees, 1);
    assert_int_equal(fa_release_lookup(q), 0);
    /* delete of one (a mismatch programs make) and realloc(q, 0) too */
    void *d = fa_host_malloc_other(300 * KB, NULL); /* takes the span w left, so the next blocks are new */
    q = fa_host_realloc(fa_host_malloc_other(1 * MB, NULL), 5 * MB, NULL);
    assert_int_equal(fa_release_lookup(q), 5 * MB | FA_RELEASE_MAPPED);
    fa_host_delete(q, 0, 0);
    assert_int_equal(grown_frees, 2);
    q = fa_host_realloc(fa_host_malloc_other(1 * MB, NULL), 5 * MB, NULL);
    assert_null(fa_host_realloc(q, 0, NULL));
    assert_int_equal(grown_frees, 3);
    assert_int_equal(fa_release_lookup(q), 0);
    fa_host_free(d, NULL);
    grown_on = false;
}

/* realloc(p, 0) frees p, as glibc's. */
static void test_size_zero_frees(void **state)
{
    (void)state;
    void *p = fa_host_malloc_other(2 * MB, NULL);
    assert_null(fa_host_realloc(p, 0, NULL));
    assert_null(find((uintptr_t)p));
    assert_int_equal(table_take(p), 0);
}

/* Shrunk in place below the large size: tcmalloc still holds the whole
 * 400 KiB span there, so the table keeps the block at its old size until
 * it is freed, once. */
static void test_shrink_below_large(void **state)
{
    (void)state;
    void *p = fa_host_malloc_other(400 * KB, NULL);
    assert_ptr_equal(fa_host_realloc(p, 220 * KB, NULL), p);
    assert_ptr_equal(fa_host_realloc(p, 240 * KB, NULL), p);
    fa_host_free(p, NULL);
    assert_null(find((uintptr_t)p));
    assert_int_equal(table_take(p), 0);

    p = fa_host_malloc_other(400 * KB, NULL);
    assert_ptr_equal(fa_host_realloc(p, 220 * KB, NULL), p);
    assert_int_equal(table_take(p), 400 * KB);
    assert_int_equal(table_take(p), 0);
    fa_host_free(p, NULL);
}

/* ---- another thread gets the old address before realloc returns -------- */

static uintptr_t reused;

static void *other_thread(void *arg)
{
    (void)arg;
    /* Given the freed span, it allocates there, frees, allocates again. */
    void *x = fa_host_malloc_other(2 * MB, NULL);
    assert_int_equal((uintptr_t)x, reused);
    fa_host_free(x, NULL);
    void *y = fa_host_malloc_other(1 * MB, NULL);
    assert_int_equal((uintptr_t)y, reused);
    return NULL;
}

static void in_between(uintptr_t old)
{
    reused = old;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, other_thread, NULL), 0);
    pthread_join(t, NULL);
}

/* realloc moves a 3 MiB block; tcmalloc frees its old address, and before
 * realloc returns, another thread is handed that address for a 2 MiB block,
 * frees it and is handed it again for 1 MiB.  Afterwards the table holds
 * the 1 MiB block at the old address, once, and the moved block at its new
 * one.  (Were the old block forgotten after tcmalloc's realloc, that late
 * forget would take out the other thread's entry and leave a stale one.) */
static void test_moved_address_reused_meanwhile(void **state)
{
    (void)state;
    void *p = fa_host_malloc_other(3 * MB, NULL);
    moved_freed = in_between;
    void *q = fa_host_realloc(p, 3 * MB + 512 * KB, NULL);
    moved_freed = NULL;
    assert_ptr_not_equal(q, p);
    assert_non_null(find((uintptr_t)p)); /* the other thread's 1 MiB block */
    assert_int_equal(table_take(p), 1 * MB);
    assert_int_equal(table_take(p), 0);
    assert_int_equal(table_take(q), 3 * MB + 512 * KB);
}

/* More live large blocks than the tables hold: each is still forgotten at
 * its own size (the ones that found no slot through tcmalloc's answer), and
 * once all are freed nothing is left to forget.  A few hundred blocks keep
 * to the 64 KiB first table; the first FIT blocks (more than the first
 * table holds, fewer than both do) are all found in the tables, without
 * asking tcmalloc even while others that overflowed make it ask. */
static void test_many_live_blocks(void **state)
{
    (void)state;
    enum { N = 100000, FEW = 300, FIT = 60000 };
    assert_int_equal(fa_release_untracked(), 0);
    for (size_t i = 0; i < N; i++) {
        uintptr_t p = MANY_BASE + i * PAGE;
        fa_release_remember((void *)p, many_size(p));
        if (i + 1 == FEW)
            assert_int_equal(fa_release_table_bytes(), 64 * KB);
        if (i + 1 == FIT)
            assert_int_equal(fa_release_untracked(), 0);
    }
    assert_int_equal(fa_release_table_bytes(), 64 * KB + 1 * MB);
    assert_true(fa_release_untracked() > 0);
    many_asked = 0;
    for (size_t i = 0; i < N; i++) {
        uintptr_t p = MANY_BASE + i * PAGE;
        assert_int_equal(table_take((void *)p), many_size(p));
        if (i + 1 == FIT)
            assert_int_equal(many_asked, 0);
    }
    assert_int_equal(fa_release_untracked(), 0);
    for (size_t i = 0; i < N; i += 97)
        assert_int_equal(table_take((void *)(MANY_BASE + i * PAGE)), 0);
}

/* Fill the tables with blocks from MANY_BASE on until exactly one found no
 * slot; returns how many were remembered (the last is the untracked one). */
static size_t fill_to_one_untracked(void)
{
    assert_int_equal(fa_release_untracked(), 0);
    size_t i = 0;
    for (; fa_release_untracked() == 0; i++) {
        uintptr_t p = MANY_BASE + i * PAGE;
        fa_release_remember((void *)p, many_size(p));
    }
    return i;
}

static void forget_filled(size_t count)
{
    for (size_t i = 0; i < count; i++)
        table_take((void *)(MANY_BASE + i * PAGE));
}

/* Once the tables overflowed, a block shrunk in place below the large size
 * and then freed leaves the count of untracked blocks as it was: its free
 * is not taken for another's. */
static void test_shrink_below_large_overflowed(void **state)
{
    (void)state;
    size_t count = fill_to_one_untracked();
    void *p = fa_host_malloc_other(400 * KB, NULL);
    assert_ptr_equal(fa_host_realloc(p, 220 * KB, NULL), p);
    fa_host_free(p, NULL);
    assert_int_equal(fa_release_untracked(), 1);
    uintptr_t last = MANY_BASE + (count - 1) * PAGE;
    assert_int_equal(table_take((void *)last), many_size(last));
    assert_int_equal(fa_release_untracked(), 0);
    forget_filled(count);
}

/* Two frees miss the tables while one block is untracked, and both are
 * held inside tcmalloc's answer until both have seen the count at one:
 * only one of them takes it, and the count stays at zero (not 2^64 - 1,
 * after which every page-aligned free would ask tcmalloc). */
static uintptr_t race_addr[2];
static size_t race_got[2];

static void *race_forget(void *arg)
{
    int k = (int)(intptr_t)arg;
    race_got[k] = fa_release_forget((void *)race_addr[k]);
    return NULL;
}

static void test_untracked_race(void **state)
{
    (void)state;
    size_t count = fill_to_one_untracked();
    race_addr[0] = MANY_BASE + (count - 1) * PAGE; /* the untracked block */
    race_addr[1] = MANY_BASE + (count + 1000) * PAGE; /* a large block never remembered */
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, 2);
    asked_barrier = &barrier;
    pthread_t t[2];
    for (int k = 0; k < 2; k++)
        assert_int_equal(pthread_create(&t[k], NULL, race_forget, (void *)(intptr_t)k), 0);
    for (int k = 0; k < 2; k++)
        pthread_join(t[k], NULL);
    asked_barrier = NULL;
    pthread_barrier_destroy(&barrier);
    assert_int_equal(fa_release_untracked(), 0);
    assert_true((race_got[0] != 0) != (race_got[1] != 0)); /* exactly one took it */
    forget_filled(count - 1);
}

int main(void)
{
    char *env[] = {"FORGEALLOC_LARGE_ALLOC_REPORT=0", "FORGEALLOC_HUGEPAGES=0", "FORGEALLOC_RELEASE_PRESSURE=0",
                   "FORGEALLOC_RELEASE_THRESHOLD=1T", NULL};
    fa_options_load(env);
    next_addr = (uintptr_t)1 << 40;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_shrink_in_place, setup),
        cmocka_unit_test_setup(test_grow_in_place, setup),
        cmocka_unit_test_setup(test_move, setup),
        cmocka_unit_test_setup(test_failure, setup),
        cmocka_unit_test_setup(test_size_zero_frees, setup),
        cmocka_unit_test_setup(test_grown_paths, setup),
        cmocka_unit_test_setup(test_shrink_below_large, setup),
        cmocka_unit_test_setup(test_moved_address_reused_meanwhile, setup),
        cmocka_unit_test_setup(test_many_live_blocks, setup),
        cmocka_unit_test_setup(test_shrink_below_large_overflowed, setup),
        cmocka_unit_test_setup(test_untracked_race, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
