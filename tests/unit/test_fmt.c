/* test_fmt.c - bounded formatting: numbers, sizes, escaping, overflow. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "fmt.h"
#include "testutil.h"

#define FMT(expr, expect)                      \
    do {                                       \
        char out_[256];                        \
        fa_buf b_;                             \
        fa_buf_init(&b_, out_, sizeof out_);   \
        fa_buf *b = &b_;                       \
        expr;                                  \
        assert_string_equal(out_, expect);     \
    } while (0)

static void test_numbers(void **state)
{
    (void)state;
    FMT(fa_buf_u64(b, 0), "0");
    FMT(fa_buf_u64(b, UINT64_MAX), "18446744073709551615");
    FMT(fa_buf_i64(b, INT64_MIN), "-9223372036854775808");
    FMT(fa_buf_hex(b, 0xdeadbeef), "deadbeef");
    FMT(fa_buf_fixed(b, 2.5, 2), "2.50");
    FMT(fa_buf_fixed(b, -0.125, 3), "-0.125");
    FMT(fa_buf_fixed(b, 1.9999, 2), "2.00");
    FMT(fa_buf_fixed(b, 7, 0), "7");
    FMT(fa_buf_grouped(b, 1234567), "1,234,567");
    FMT(fa_buf_grouped(b, 999), "999");
    FMT(fa_buf_bytes(b, 512), "512 B");
    FMT(fa_buf_bytes(b, 1536), "1.50 KiB");
    FMT(fa_buf_bytes(b, 64ull << 20), "64.0 MiB");
    FMT(fa_buf_bytes(b, 3ull << 30), "3.00 GiB");
    FMT(fa_buf_bytes(b, 200ull << 40), "200 TiB");
}

/* Through a pointer, so the compiler's format checks let odd input by. */
static void (*volatile unchecked_printf)(fa_buf *, const char *, ...) = fa_buf_printf;

static void test_printf(void **state)
{
    (void)state;
    FMT(fa_buf_printf(b, "a%sb%dc%uz%zu%%%c", "X", -5, 7u, (size_t)42, '!'), "aXb-5c7z42%!");
    FMT(fa_buf_printf(b, "%lld %llu %lx", -1ll, 1ull << 40, 255ul), "-1 1099511627776 ff");
    FMT(fa_buf_printf(b, "%p", (void *)0x1000), "0x1000");
    FMT(unchecked_printf(b, "%s", (const char *)NULL), "(null)");
    FMT(unchecked_printf(b, "%q end"), "%q end"); /* unknown conversions are copied */
}

static void test_escaping(void **state)
{
    (void)state;
    FMT(fa_buf_json_str(b, "a\"b\\c\nd\te\x01\xc3\xa9"), "\"a\\\"b\\\\c\\nd\\te\\u0001\xc3\xa9\"");
    /* UTF-8 as itself (a path such as AI绘画), every other byte escaped:
     * cut sequences, overlong forms, surrogates, stray continuation bytes. */
    FMT(fa_buf_json_str(b, "/AI\xe7\xbb\x98\xe7\x94\xbb/\xf0\x9f\x8e\xa8"), "\"/AI\xe7\xbb\x98\xe7\x94\xbb/\xf0\x9f\x8e\xa8\"");
    FMT(fa_buf_json_str(b, "\xe7\xbb/\xc0\xaf\xed\xa0\x80\x80\xf5\x80\x80\x80"),
        "\"\\u00e7\\u00bb/\\u00c0\\u00af\\u00ed\\u00a0\\u0080\\u0080\\u00f5\\u0080\\u0080\\u0080\"");
    FMT(fa_buf_quoted_raw(b, "ok\x1b[31m\xff", 64), "ok\\x1b[31m\\xff");
    FMT(fa_buf_quoted_raw(b, "abcdef", 3), "abc...");
    char out[600];
    fa_buf b;
    fa_buf_init(&b, out, sizeof out);
    fa_buf_json_str(&b, "\x7f\x80\xfe path\\with \"quotes\"");
    assert_true(fa_json_valid(out));
}

static void test_overflow(void **state)
{
    (void)state;
    char out[8];
    fa_buf b;
    fa_buf_init(&b, out, sizeof out);
    fa_buf_str(&b, "abc");
    assert_false(fa_buf_overflowed(&b));
    fa_buf_str(&b, "defghij");
    assert_true(fa_buf_overflowed(&b));
    assert_string_equal(out, "abcdefg"); /* what fits, NUL-terminated */
    assert_int_equal(b.need, 10);
    fa_buf_str(&b, "xyz"); /* later text never lands after a cut */
    assert_string_equal(out, "abcdefg");
    assert_int_equal(b.need, 13);
    fa_buf zero;
    fa_buf_init(&zero, NULL, 0);
    fa_buf_u64(&zero, 12345);
    assert_int_equal(zero.need, 5);
}

static void test_nocase(void **state)
{
    (void)state;
    assert_true(fa_streq_nocase("JSON", "json"));
    assert_false(fa_streq_nocase("json", "jso"));
    assert_false(fa_streq_nocase("", "x"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_numbers), cmocka_unit_test(test_printf), cmocka_unit_test(test_escaping),
        cmocka_unit_test(test_overflow), cmocka_unit_test(test_nocase),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
