/* test_startfill.c - clearing without faulting in what reads as zeros
 * (startfill.c): the start fill and the calloc clear write every page that
 * holds something and leave only untouched anonymous pages alone; the
 * start fill always writes a file mapping;
 * finding and swapping a library's memset slot with lazy binding, full
 * RELRO and -fno-plt. */
#define _GNU_SOURCE
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "../../src/host/startfill.h"
#include "testutil.h"

void *gotcall_lazy(void *p, int c, size_t n);
void *gotcall_now(void *p, int c, size_t n);
void *gotcall_noplt(void *p, int c, size_t n);

#define PAGES 64

static size_t page;

static bool all(const unsigned char *p, size_t n, unsigned char v)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != v)
            return false;
    return true;
}

/* Clears [p, p+n) and returns the bytes it left untouched. */
typedef size_t (*zero_fill)(void *p, size_t n);

static size_t start_fill_zero(void *p, size_t n)
{
    size_t before = fa_start_fill_left();
    assert_ptr_equal(fa_start_fill(p, 0, n), p);
    return fa_start_fill_left() - before;
}

/* Pages with data, pages written with zeros and pages given back are
 * cleared; untouched pages stay untouched (and read as zeros); the partial
 * pages at both ends are written; bytes outside the range are kept. */
static void check_leaves_untouched_pages(zero_fill fill)
{
    unsigned char *m = fa_map_pages(PAGES);
    memset(m, 0xab, page);                          /* page 0: head, outside part kept */
    memset(m + (PAGES - 1) * page, 0xcd, page);     /* last page: tail */
    for (int i = 1; i < PAGES - 1; i++) {
        switch (i % 4) {
        case 0: m[i * page + 17] = 1; break;              /* data */
        case 1: memset(m + i * page, 0, page); break;     /* resident zeros */
        case 2: break;                                    /* never touched */
        case 3:                                           /* written, then given back */
            memset(m + i * page, 0x5a, page);
            assert_int_equal(madvise(m + i * page, page, MADV_DONTNEED), 0);
            break;
        }
    }
    errno = 1234;
    size_t off = 100, n = PAGES * page - off - 30;
    size_t left = fill(m + off, n);
    assert_int_equal(errno, 1234);
    assert_true(all(m, off, 0xab));
    assert_true(all(m + off, n, 0));
    assert_true(all(m + off + n, 30, 0xcd));
    size_t untouched = 0;
    for (int i = 1; i < PAGES - 1; i++) {
        if (i % 4 == 0 || i % 4 == 1)
            assert_true(fa_page_resident(m + i * page)); /* written, not given back */
        else
            untouched++;
    }
    /* Reading the untouched pages above mapped the zero page for them;
     * what counts is that the fill did not write them. */
    assert_int_equal(left, untouched * page);
    munmap(m, PAGES * page);
}

static void test_fill_leaves_untouched_pages(void **state)
{
    (void)state;
    check_leaves_untouched_pages(start_fill_zero);
}

static void test_clear_leaves_untouched_pages(void **state)
{
    (void)state;
    check_leaves_untouched_pages(fa_clear_anonymous);
}

/* Untouched pages that the check above read stay out of the RSS: only the
 * pages that held something become resident. */
static void check_faults_nothing_in(zero_fill fill)
{
    unsigned char *m = fa_map_pages(PAGES);
    m[5 * page] = 1;
    assert_int_equal(fill(m, PAGES * page), (PAGES - 1) * page);
    unsigned char v[PAGES];
    assert_int_equal(mincore(m, PAGES * page, v), 0);
    for (int i = 0; i < PAGES; i++)
        assert_int_equal(v[i] & 1, i == 5);
    assert_int_equal(m[5 * page], 0);
    munmap(m, PAGES * page);
}

static void test_fill_faults_nothing_in(void **state)
{
    (void)state;
    check_faults_nothing_in(start_fill_zero);
}

static void test_clear_faults_nothing_in(void **state)
{
    (void)state;
    check_faults_nothing_in(fa_clear_anonymous);
}

/* A clear within one page, or across a page boundary without a whole page,
 * is a memset. */
static void test_clear_small(void **state)
{
    (void)state;
    unsigned char *m = fa_map_pages(4);
    memset(m, 0x33, 4 * page);
    assert_int_equal(fa_clear_anonymous(m + 10, 100), 0);
    assert_int_equal(fa_clear_anonymous(m + page - 50, page), 0);
    for (size_t i = 0; i < 4 * page; i++) {
        bool cleared = (i >= 10 && i < 110) || (i >= page - 50 && i < 2 * page - 50);
        assert_int_equal(m[i], cleared ? 0 : 0x33);
    }
    munmap(m, 4 * page);
}

/* A private file mapping reads its file's bytes where it was never
 * touched: the fill writes it whole, also when it sits inside an anonymous
 * mapping (MAP_FIXED) whose untouched pages it leaves alone. */
static void test_fill_writes_file_pages(void **state)
{
    (void)state;
    char path[] = "/tmp/fa-startfill-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    unsigned char *data = malloc(16 * page);
    memset(data, 0x77, 16 * page);
    assert_int_equal(write(fd, data, 16 * page), (ssize_t)(16 * page));
    free(data);

    unsigned char *f = mmap(NULL, 16 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    assert_true(f != MAP_FAILED);
    fa_start_fill(f, 0, 16 * page);
    assert_true(all(f, 16 * page, 0));
    munmap(f, 16 * page);

    unsigned char *m = fa_map_pages(PAGES);
    void *fixed = mmap(m + 16 * page, 16 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, fd, 0);
    assert_ptr_equal(fixed, m + 16 * page);
    size_t before = fa_start_fill_left();
    fa_start_fill(m, 0, PAGES * page);
    assert_true(all(m, PAGES * page, 0));
    assert_int_equal(fa_start_fill_left() - before, (PAGES - 16) * page);
    munmap(m, PAGES * page);
    close(fd);
}

/* Other values, and fills too small to be worth a look, are memset's. */
static void test_fill_other_values_and_small(void **state)
{
    (void)state;
    unsigned char *m = fa_map_pages(PAGES);
    size_t before = fa_start_fill_left();
    fa_start_fill(m, 0x11, PAGES * page);
    assert_true(all(m, PAGES * page, 0x11));
    fa_start_fill(m + page, 0, 4 * page);
    assert_true(all(m + page, 4 * page, 0));
    assert_true(all(m + 5 * page, (PAGES - 5) * page, 0x11));
    assert_int_equal(fa_start_fill_left(), before);
    munmap(m, PAGES * page);
}

static int counted;
static void *counting_memset(void *p, int c, size_t n)
{
    counted++;
    return memset(p, c, n);
}

/* The protection /proc/self/maps shows for the page holding p. */
static char protection(const void *p)
{
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    char line[512], w = '?';
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char perms[5];
        if (sscanf(line, "%lx-%lx %4s", &lo, &hi, perms) == 3 && (uintptr_t)p >= lo && (uintptr_t)p < hi)
            w = perms[1];
    }
    fclose(f);
    return w;
}

static void swap_and_back(void *(*fn)(void *, int, size_t), bool relro)
{
    fa_got_slot s;
    assert_true(fa_got_find((const void *)fn, "memset", &s));
    assert_int_equal(s.relro, relro);
    char before = protection(s.at);
    assert_int_equal(before, relro ? '-' : 'w');
    unsigned char buf[64];
    void *old = NULL, *ours = NULL;
    assert_true(fa_got_swap(&s, (void *)counting_memset, &old));
    assert_int_equal(protection(s.at), before); /* RELRO is read-only again */
    counted = 0;
    fn(buf, 7, sizeof buf);
    assert_int_equal(counted, 1);
    assert_true(all(buf, sizeof buf, 7));
    assert_true(fa_got_swap(&s, old, &ours));
    assert_ptr_equal(ours, (void *)counting_memset);
    fn(buf, 9, sizeof buf);
    assert_int_equal(counted, 1);
    assert_true(all(buf, sizeof buf, 9));
    assert_false(fa_got_find((const void *)fn, "fa_no_such_function", &s));
}

static void test_got_lazy(void **state) { (void)state; swap_and_back(gotcall_lazy, false); }
static void test_got_full_relro(void **state) { (void)state; swap_and_back(gotcall_now, true); }
static void test_got_no_plt(void **state) { (void)state; swap_and_back(gotcall_noplt, true); }

/* An address in no object has no slot. */
static void test_got_not_an_object(void **state)
{
    (void)state;
    unsigned char *m = fa_map_pages(1);
    fa_got_slot s;
    assert_false(fa_got_find(m, "memset", &s));
    munmap(m, page);
}

/* The loader protects only RELRO's whole pages: a slot on its last partial
 * page shares that page with data and stays writable. */
static void test_relro_whole_pages(void **state)
{
    (void)state;
    const size_t pg = 4096;
    uintptr_t lo = 0x10000 + 0x2e0; /* RELRO starting mid-page, as linkers lay it out */
    size_t size = 3 * pg - 0x2e0;   /* ends on a page boundary: three pages protected */
    assert_true(fa_relro_protects(lo, size, pg, lo));
    assert_true(fa_relro_protects(lo, size, pg, 0x10000)); /* its first page, rounded down */
    assert_true(fa_relro_protects(lo, size, pg, lo + size - 8));
    assert_false(fa_relro_protects(lo, size, pg, lo + size));
    size -= 0x100; /* ends mid-page: that page is left writable */
    assert_true(fa_relro_protects(lo, size, pg, 0x11000));
    assert_false(fa_relro_protects(lo, size, pg, 0x12000));
    assert_false(fa_relro_protects(lo, size, pg, lo + size - 8));
    assert_false(fa_relro_protects(0x10010, 0x800, pg, 0x10100)); /* less than a page: nothing */
    assert_false(fa_relro_protects(lo, size, pg, 0xfff8));
}

int main(void)
{
    page = (size_t)sysconf(_SC_PAGESIZE);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fill_leaves_untouched_pages),
        cmocka_unit_test(test_fill_faults_nothing_in),
        cmocka_unit_test(test_clear_leaves_untouched_pages),
        cmocka_unit_test(test_clear_faults_nothing_in),
        cmocka_unit_test(test_clear_small),
        cmocka_unit_test(test_fill_writes_file_pages),
        cmocka_unit_test(test_fill_other_values_and_small),
        cmocka_unit_test(test_relro_whole_pages),
        cmocka_unit_test(test_got_lazy),
        cmocka_unit_test(test_got_full_relro),
        cmocka_unit_test(test_got_no_plt),
        cmocka_unit_test(test_got_not_an_object),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
