/* test_grown.c - blocks that realloc grows, in mappings of their own
 * (grown.c), over the release policy's table (release.c) and real
 * mappings: a tcmalloc block moves in with its bytes; growing in place and
 * by a move of the kernel's keeps them; shrinking stays in place; free
 * unmaps; and where the table has no slot for a moved block, it becomes a
 * tcmalloc block (here: the test's stand-in, glibc's malloc) with its
 * bytes; a mapping split in pieces is copied instead of moved.  tcmalloc is
 * not linked: the test defines what release.c and grown.c call of it. */
#define _GNU_SOURCE
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cmocka.h>

#include "../../src/core/options.h"
#include "../../src/host/grown.h"
#include "../../src/host/release.h"

#define MB ((size_t)1 << 20)

int MallocExtension_GetNumericProperty(const char *name, size_t *value)
{
    (void)name;
    *value = 0;
    return 1;
}
void MallocExtension_ReleaseToSystem(size_t n) { (void)n; }
void MallocExtension_ReleaseFreeMemory(void) {}
size_t tc_malloc_size(void *p) { return (void)p, 0; }
static int tc_mallocs;
void *tc_malloc(size_t n)
{
    tc_mallocs++;
    return malloc(n);
}

/* One byte per page, from the page's number. */
/* grown.c's system calls pass through here (-Wl,--wrap=syscall): a move
 * by the kernel records whether the block's old address had left the
 * table before its pages went (another thread's block may be mapped
 * there at once). */
long __real_syscall(long number, ...);
static int fixed_moves, moves_still_listed;
long __wrap_syscall(long number, ...)
{
    va_list ap;
    va_start(ap, number);
    long a[6];
    for (int i = 0; i < 6; i++)
        a[i] = va_arg(ap, long);
    va_end(ap);
    if (number == SYS_mremap && (a[3] & MREMAP_FIXED)) {
        fixed_moves++;
        moves_still_listed += fa_release_lookup((void *)a[0]) != 0;
    }
    return __real_syscall(number, a[0], a[1], a[2], a[3], a[4], a[5]);
}

static void fill(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i += 4096)
        p[i] = (unsigned char)(i / 4096 * 31 + seed);
}
static bool same(const unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i += 4096)
        if (p[i] != (unsigned char)(i / 4096 * 31 + seed))
            return false;
    return true;
}
static bool mapped(const void *p)
{
    unsigned char v;
    return mincore((void *)((uintptr_t)p & ~(uintptr_t)4095), 4096, &v) == 0;
}

/* A block moves in with its bytes, grows in place and by a move, shrinks
 * in place, and is unmapped at free; errno is left alone (mincore, the
 * test's own check, sets it). */
static void test_grow_move_shrink_free(void **state)
{
    (void)state;
    size_t n0 = 5 * MB;
    unsigned char *src = malloc(n0);
    fill(src, n0, 7);
    errno = EBADF;
    unsigned char *q = fa_grown_adopt(src, n0, 6 * MB);
    assert_non_null(q);
    assert_int_equal((uintptr_t)q % 4096, 0);
    assert_true(same(q, n0, 7));
    assert_int_equal(fa_release_lookup(q), 6 * MB | FA_RELEASE_MAPPED);
    assert_int_equal(fa_grown_bytes(), 6 * MB);
    assert_int_equal(errno, EBADF);
    free(src);

    /* In place where the addresses after it are free. */
    bool to_tc = true;
    unsigned char *r = fa_grown_realloc(q, 6 * MB, 64 * MB, &to_tc);
    assert_non_null(r);
    assert_false(to_tc);
    assert_true(same(r, n0, 7));
    memset(r + n0, 1, 64 * MB - n0);
    assert_int_equal(fa_release_lookup(r), 64 * MB | FA_RELEASE_MAPPED);
    if (r != q)
        assert_int_equal(fa_release_lookup(q), 0);
    fill(r, 64 * MB, 9);

    /* Moved by the kernel where a mapping sits right after it. */
    void *wall = mmap(r + 64 * MB, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    assert_true(wall == r + 64 * MB);
    errno = EBADF;
    unsigned char *m = fa_grown_realloc(r, 64 * MB, 96 * MB, &to_tc);
    assert_int_equal(errno, EBADF); /* the failed try in place left no trace */
    assert_non_null(m);
    assert_false(to_tc);
    assert_true(m != r);
    assert_true(same(m, 64 * MB, 9));
    assert_false(mapped(r)); /* the old range went with the move */
    assert_true(mapped(wall));
    assert_int_equal(fa_release_lookup(r), 0);
    assert_true(fixed_moves >= 1);
    assert_int_equal(moves_still_listed, 0); /* out of the table before the kernel moved it */
    assert_int_equal(fa_release_lookup(m), 96 * MB | FA_RELEASE_MAPPED);
    assert_int_equal(fa_grown_bytes(), 96 * MB);
    munmap(wall, 4096);

    /* Shrunk in place; usable size is the mapping's. */
    assert_ptr_equal(fa_grown_realloc(m, 96 * MB, 3 * MB + 5, &to_tc), m);
    assert_true(same(m, 3 * MB, 9));
    assert_int_equal(fa_grown_usable(3 * MB + 5), 3 * MB + 4096);
    assert_int_equal(fa_grown_bytes(), 3 * MB + 4096);
    assert_false(mapped(m + 3 * MB + 4096));

    assert_int_equal(fa_release_forget(m), (3 * MB + 5) | FA_RELEASE_MAPPED);
    errno = EBADF;
    fa_grown_free(m, 3 * MB + 5);
    assert_int_equal(errno, EBADF);
    assert_false(mapped(m));
    assert_int_equal(fa_grown_bytes(), 0);
}

/* A grown block of n bytes, its pages filled from seed (through a
 * malloc'd block that stands for tcmalloc's). */
static unsigned char *grown_filled(size_t n, unsigned seed)
{
    unsigned char *src = malloc(n);
    fill(src, n, seed);
    unsigned char *q = fa_grown_adopt(src, n, n);
    assert_non_null(q);
    free(src);
    return q;
}

/* A mapping the program split (mprotect on part of it, or huge pages
 * asked for part of it) can be neither resized nor moved by mremap: a
 * grown block in one is copied to its new mapping, with its bytes. */
static void test_split_mapping(void **state)
{
    (void)state;
    unsigned char *q = grown_filled(6 * MB, 5);
    assert_int_equal(mprotect(q + 2 * MB, 4096, PROT_READ), 0); /* three mappings now */
    bool to_tc = true;
    errno = EBADF;
    unsigned char *r = fa_grown_realloc(q, 6 * MB, 20 * MB, &to_tc);
    assert_int_equal(errno, EBADF);
    assert_non_null(r);
    assert_false(to_tc);
    assert_true(same(r, 6 * MB, 5));
    memset(r, 7, 20 * MB); /* all of it writable */
    assert_int_equal(fa_release_lookup(r), 20 * MB | FA_RELEASE_MAPPED);
    if (r != q) {
        assert_int_equal(fa_release_lookup(q), 0);
        assert_false(mapped(q + 2 * MB)); /* the old pieces went */
    }
    assert_int_equal(fa_release_forget(r), 20 * MB | FA_RELEASE_MAPPED);
    fa_grown_free(r, 20 * MB);
    assert_int_equal(fa_grown_bytes(), 0);
}

/* Where the table has no slot for it, a block does not move in (adopt
 * returns NULL, tcmalloc keeps it), and a grown block that the kernel
 * would move becomes a tcmalloc block with its bytes. */
static void test_table_full(void **state)
{
    (void)state;
    unsigned char *q = grown_filled(4 * MB, 3);
    void *wall = mmap(q + 4 * MB, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    assert_true(wall == q + 4 * MB);
    /* Fill every slot: made-up page addresses, far from any mapping. */
    for (uintptr_t a = (uintptr_t)1 << 45, k = 0; k < 300000; k++, a += 4096)
        fa_release_remember((void *)a, 2 * MB);
    assert_true(fa_release_untracked() > 0);
    unsigned char other[4096];
    memset(other, 5, sizeof other);
    assert_null(fa_grown_adopt(other, sizeof other, 8 * MB));

    bool to_tc = false;
    tc_mallocs = 0;
    unsigned char *t = fa_grown_realloc(q, 4 * MB, 8 * MB, &to_tc);
    assert_non_null(t);
    assert_true(to_tc);
    assert_int_equal(tc_mallocs, 1);
    assert_true(same(t, 4 * MB, 3));
    assert_false(mapped(q));
    assert_int_equal(fa_release_lookup(q), 0);
    assert_int_equal(fa_grown_bytes(), 0);
    free(t);
    munmap(wall, 4096);
}

int main(void)
{
    char *env[] = {"FORGEALLOC_RELEASE_PRESSURE=0", NULL};
    fa_options_load(env);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grow_move_shrink_free),
        cmocka_unit_test(test_split_mapping),
        cmocka_unit_test(test_table_full),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
