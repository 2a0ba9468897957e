/* test_zeropages.c - giving back pages that hold only zeros (zeropages.c):
 * which pages go, that what stays is intact, holes in the range, and the
 * start-up pass over a BSS and the brk heap, and the line reader it reads
 * /proc/self/maps with. */
#define _GNU_SOURCE
#include <pthread.h>
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

#include "../../src/host/zeropages.h"
#include "log.h"
#include "testutil.h"

#define PAGES 64

static size_t page;

/* Written zero pages go; pages with one nonzero byte (first or last),
 * pages never touched and pages with data stay, their contents intact. */
static void test_only_zero_pages_go(void **state)
{
    (void)state;
    unsigned char *m = fa_map_pages(PAGES);
    for (int i = 0; i < PAGES; i++) {
        switch (i % 8) {
        case 0: case 1: case 2: /* a run of three zero pages */
            memset(m + i * page, 0, page);
            break;
        case 3:
            m[i * page] = 1;
            break;
        case 4:
            m[i * page + page - 1] = 0x80;
            break;
        case 5: /* never touched */
            break;
        case 6:
            memset(m + i * page, 0xa5, page);
            break;
        case 7: /* a lone zero page */
            memset(m + i * page, 0, page);
            break;
        }
    }
    /* A page never touched is resident only where the kernel faults in
     * several pages at once (multi-size THP); then it is a zero page too. */
    size_t untouched_resident = 0;
    for (int i = 5; i < PAGES; i += 8)
        untouched_resident += fa_page_resident(m + i * page);
    size_t dropped = fa_zero_pages_drop((uintptr_t)m, (uintptr_t)m + PAGES * page, page);
    assert_int_equal(dropped, ((PAGES / 8) * 4 + untouched_resident) * page);
    for (int i = 0; i < PAGES; i++) {
        unsigned char *p = m + i * page;
        int kind = i % 8;
        bool zero_page = kind <= 2 || kind == 5 || kind == 7;
        assert_int_equal(fa_page_resident(p), !zero_page);
        for (size_t j = 0; j < page; j++) {
            unsigned char want = 0;
            if (kind == 3 && j == 0)
                want = 1;
            else if (kind == 4 && j == page - 1)
                want = 0x80;
            else if (kind == 6)
                want = 0xa5;
            if (p[j] != want)
                fail_msg("page %d byte %zu: %#x, want %#x", i, j, p[j], want);
        }
    }
    /* A dropped page is an ordinary page again. */
    m[5] = 7;
    assert_int_equal(m[5], 7);
    assert_true(fa_page_resident(m));
    munmap(m, PAGES * page);
}

/* Holes in the range are skipped; the pages around them are still seen. */
static void test_holes_skipped(void **state)
{
    (void)state;
    unsigned char *m = fa_map_pages(PAGES);
    memset(m, 0, PAGES * page);
    memset(m + 10 * page, 1, page);
    assert_int_equal(munmap(m + 20 * page, page), 0);
    assert_int_equal(munmap(m + 40 * page, 8 * page), 0);
    size_t dropped = fa_zero_pages_drop((uintptr_t)m, (uintptr_t)m + PAGES * page, page);
    assert_int_equal(dropped, (PAGES - 1 - 1 - 8) * page);
    assert_true(fa_page_resident(m + 10 * page));
    assert_false(fa_page_resident(m + 63 * page));
    munmap(m, 20 * page);
    munmap(m + 21 * page, 19 * page);
    munmap(m + 48 * page, 16 * page);
}

static void test_parse_stat(void **state)
{
    (void)state;
    long threads = 0;
    const char *line = "4242 (a) b (c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 3 0 12345 1000000 "
                       "200 18446744073709551615 1 2 3 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n";
    assert_true(fa_zero_pages_parse_stat(line, &threads));
    assert_int_equal(threads, 3);
    assert_false(fa_zero_pages_parse_stat("4242 (a) S 1 2 3", &threads));
    assert_false(fa_zero_pages_parse_stat("no parenthesis at all", &threads));
    assert_false(fa_zero_pages_parse_stat("1 (x) S 1 1 1 0 -1 4 1 0 0 0 1 2 0 0 20 0 x 0", &threads));

    char text[1024];
    assert_true(fa_read_file("/proc/self/stat", text, sizeof text) > 0);
    assert_true(fa_zero_pages_parse_stat(text, &threads));
    assert_true(threads >= 1);
}

static void test_parse_maps(void **state)
{
    (void)state;
    fa_mapping m;
    assert_true(fa_zero_pages_parse_maps_line(
        "55d259b64000-55d25a464000 rw-p 00000000 00:00 0                          [heap]", &m));
    assert_true(m.lo == 0x55d259b64000 && m.hi == 0x55d25a464000 && m.anonymous && m.heap);
    assert_true(fa_zero_pages_parse_maps_line("7f4fb254f000-7f4fb2702000 rw-p 00000000 00:00 0 ", &m));
    assert_true(m.anonymous && !m.heap);
    assert_true(fa_zero_pages_parse_maps_line("7f4fb254f000-7f4fb2702000 rw-p 00000000 00:00 0", &m));
    assert_true(m.anonymous && !m.heap);
    /* A file's private writable mapping: its pages revert to the file. */
    assert_true(fa_zero_pages_parse_maps_line(
        "7ff9bae1b000-7ff9bae1c000 rw-p 00028000 fe:00 14885122   /usr/lib/libtcmalloc_minimal.so.4", &m));
    assert_false(m.anonymous);
    assert_true(fa_zero_pages_parse_maps_line("7ff9bae1b000-7ff9bae1c000 rw-p 00000000 fe:00 10   /tmp/x (deleted)", &m));
    assert_false(m.anonymous);
    /* A file system may report inode 0 for a file (FUSE): its device says it is one. */
    assert_true(fa_zero_pages_parse_maps_line("7f0000000000-7f0000001000 rw-p 00000000 00:2f 0   /mnt/fuse/f", &m));
    assert_false(m.anonymous);
    /* Shared, read-only or inaccessible anonymous memory is left alone. */
    assert_true(fa_zero_pages_parse_maps_line("7f0000000000-7f0000001000 rw-s 00000000 00:01 5 /dev/zero (deleted)", &m));
    assert_false(m.anonymous);
    assert_true(fa_zero_pages_parse_maps_line("7f0000000000-7f0000001000 r--p 00000000 00:00 0", &m));
    assert_false(m.anonymous);
    assert_true(fa_zero_pages_parse_maps_line("7f0000000000-7f0000001000 ---p 00000000 00:00 0", &m));
    assert_false(m.anonymous);
    assert_true(fa_zero_pages_parse_maps_line("7ffe4e050000-7ffe4e071000 rw-p 00000000 00:00 0   [stack]", &m));
    assert_true(m.anonymous && !m.heap);
    assert_false(fa_zero_pages_parse_maps_line("", &m));
    assert_false(fa_zero_pages_parse_maps_line("zz-7f rw-p 0 00:00 0", &m));
    assert_false(fa_zero_pages_parse_maps_line("2000-1000 rw-p 00000000 00:00 0", &m));
    assert_false(fa_zero_pages_parse_maps_line("1000-2000 rw-p", &m));
}

struct lines {
    char seen[8][16];
    int n, stop_after;
};

static bool note_line(char *line, void *arg)
{
    struct lines *l = arg;
    if (l->n < 8)
        snprintf(l->seen[l->n], sizeof l->seen[0], "%.15s", line);
    l->n++;
    return l->n != l->stop_after;
}

/* The line reader behind the maps scan (log.c): lines without their
 * newline, empty ones too, a line longer than its buffer skipped whole (no
 * fragment of it seen), a last line without a newline, stopping early. */
static void test_read_lines(void **state)
{
    (void)state;
    char path[] = "/tmp/fa-lines-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    char text[12000];
    size_t len = 0;
    len += (size_t)sprintf(text + len, "first\n\n");
    memset(text + len, 'x', 9000);
    len += 9000;
    len += (size_t)sprintf(text + len, "tail\nafter\nlast");
    assert_int_equal(write(fd, text, len), (ssize_t)len);
    close(fd);

    struct lines l = {0};
    assert_true(fa_read_lines(path, note_line, &l));
    assert_int_equal(l.n, 4);
    assert_string_equal(l.seen[0], "first");
    assert_string_equal(l.seen[1], "");
    assert_string_equal(l.seen[2], "after");
    assert_string_equal(l.seen[3], "last");

    struct lines early = {.stop_after = 2};
    assert_true(fa_read_lines(path, note_line, &early));
    assert_int_equal(early.n, 2);
    unlink(path);
    struct lines none = {0};
    assert_false(fa_read_lines(path, note_line, &none));
    assert_int_equal(none.n, 0);
}

static long thread_count(void)
{
    char text[1024];
    long threads = 0;
    if (fa_read_file("/proc/self/stat", text, sizeof text) <= 0 || !fa_zero_pages_parse_stat(text, &threads))
        return -1;
    return threads;
}

static unsigned char bss[16 * 4096] __attribute__((aligned(4096)));

/* One thread: zero pages of the object's BSS and of the brk heap go; data
 * on both stays. */
static void test_start_pass(void **state)
{
    (void)state;
    if (thread_count() != 1)
        skip(); /* a sanitizer's runtime started a thread: the pass rightly does nothing */
    memset(bss, 0, sizeof bss);
    bss[3 * page] = 9;
    unsigned char *heap = sbrk(0);
    unsigned char *grown = sbrk((intptr_t)(8 * page));
    assert_true(grown != (void *)-1);
    unsigned char *h = (unsigned char *)(((uintptr_t)grown + page - 1) & ~(uintptr_t)(page - 1));
    (void)heap;
    memset(grown, 0, 8 * page);
    h[page] = 4;
    size_t dropped = fa_zero_pages_at_start(bss);
    assert_true(dropped >= (16 - 1 + 5) * page);
    assert_false(fa_page_resident(bss));
    assert_false(fa_page_resident(bss + 15 * page));
    assert_true(fa_page_resident(bss + 3 * page));
    assert_int_equal(bss[3 * page], 9);
    assert_false(fa_page_resident(h + 2 * page));
    assert_true(fa_page_resident(h + page));
    assert_int_equal(h[page], 4);
    h[page] = 0;
    sbrk(-(intptr_t)(8 * page));
}

/* A private file mapping inside the heap's range (placed there with
 * MAP_FIXED): a page of it the program zeroed would read the file again after
 * MADV_DONTNEED, so the pass leaves it alone. */
static void test_start_pass_skips_file_pages(void **state)
{
    (void)state;
    if (thread_count() != 1)
        skip();
    char path[] = "/tmp/fa-zeropages-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    unsigned char *fill = fa_map_pages(1);
    memset(fill, 0x5a, page);
    assert_int_equal(write(fd, fill, page), (ssize_t)page);
    munmap(fill, page);
    unsigned char *grown = sbrk((intptr_t)(8 * page));
    assert_true(grown != (void *)-1);
    unsigned char *h = (unsigned char *)(((uintptr_t)grown + page - 1) & ~(uintptr_t)(page - 1));
    memset(grown, 0, 8 * page);
    unsigned char *f = mmap(h + 2 * page, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, fd, 0);
    assert_true(f == h + 2 * page);
    close(fd);
    assert_int_equal(f[0], 0x5a);
    memset(f, 0, page); /* the program's own copy, zero */
    fa_zero_pages_at_start(NULL);
    for (size_t j = 0; j < page; j++)
        if (f[j] != 0)
            fail_msg("byte %zu of the zeroed file page reads %#x after the pass", j, f[j]);
    assert_false(fa_page_resident(h + 3 * page)); /* the heap around it was still looked at */
    sbrk(-(intptr_t)(8 * page));
}

static void *sleeper(void *arg)
{
    pthread_barrier_t *b = arg;
    pthread_barrier_wait(b); /* started */
    pthread_barrier_wait(b); /* done */
    return NULL;
}

/* With a second thread, nothing is touched: that thread could write a page
 * between its check and its madvise. */
static void test_start_pass_needs_one_thread(void **state)
{
    (void)state;
    pthread_barrier_t b;
    pthread_barrier_init(&b, NULL, 2);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, sleeper, &b), 0);
    pthread_barrier_wait(&b);
    memset(bss, 0, sizeof bss);
    assert_int_equal(fa_zero_pages_at_start(bss), 0);
    assert_true(fa_page_resident(bss));
    pthread_barrier_wait(&b);
    pthread_join(t, NULL);
    pthread_barrier_destroy(&b);
}

int main(void)
{
    page = (size_t)sysconf(_SC_PAGESIZE);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_only_zero_pages_go),
        cmocka_unit_test(test_holes_skipped),
        cmocka_unit_test(test_parse_stat),
        cmocka_unit_test(test_parse_maps),
        cmocka_unit_test(test_read_lines),
        cmocka_unit_test(test_start_pass),
        cmocka_unit_test(test_start_pass_skips_file_pages),
        cmocka_unit_test(test_start_pass_needs_one_thread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
