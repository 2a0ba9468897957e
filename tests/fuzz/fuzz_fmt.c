/* fuzz_fmt.c - libFuzzer harness for the bounded formatter
 * (src/core/fmt.c).
 *
 * Input: byte 0 sets the capacity (0..64) of a small buffer, the rest is a
 * list of operations (an opcode byte, then its arguments).  Every operation
 * goes to the small buffer and to a large one; after each, the small one
 * must keep the fa_buf contract (support.h), and what the operation added
 * to the large one must be right:
 *  - putc, mem, str: the bytes given ("(null)" for NULL);
 *  - u64, i64, hex, grouped: what snprintf gives (commas every 3 digits);
 *  - fixed: [-]digits[.decimals] within half a unit of the last digit;
 *  - bytes: "N B" below 1 KiB, else a 0-2 decimal number and a binary unit;
 *  - json_str: one valid JSON string that decodes to the input bytes;
 *  - quoted_raw: printable ASCII that decodes to the first `max` bytes,
 *    followed by "..." when the input was longer;
 *  - printf with a fixed format and fuzzed arguments: what snprintf gives,
 *    or the format copied as written for unsupported conversions.
 * fa_streq_nocase is compared with an ASCII case-insensitive comparison.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "support.h"

#define MAX_OPS 64
#define MAX_STR 255

static char full_store[128 * 1024]; /* MAX_OPS of the longest output */

enum arg_kind { ARG_NONE, ARG_STR, ARG_CHAR, ARG_INT, ARG_LONG, ARG_LLONG, ARG_UINT, ARG_ULONG, ARG_ULLONG,
                ARG_SIZE, ARG_SSIZE, ARG_PTR };

/* Formats with no argument print `literal`. */
static const struct {
    const char *fmt;
    enum arg_kind arg;
    const char *literal;
} formats[] = {
    {"%s", ARG_STR, NULL},       {"%s='%s'", ARG_STR, NULL}, {"[%c]", ARG_CHAR, NULL},
    {"%d", ARG_INT, NULL},       {"%i%%", ARG_INT, NULL},    {"%ld", ARG_LONG, NULL},
    {"%lld", ARG_LLONG, NULL},   {"%u", ARG_UINT, NULL},     {"%x", ARG_UINT, NULL},
    {"%lu", ARG_ULONG, NULL},    {"%lx", ARG_ULONG, NULL},   {"%llu", ARG_ULLONG, NULL},
    {"%llx", ARG_ULLONG, NULL},  {"%zu", ARG_SIZE, NULL},    {"%zx", ARG_SIZE, NULL},
    {"%zd", ARG_SSIZE, NULL},    {"at %p", ARG_PTR, NULL},   {"plain text", ARG_NONE, "plain text"},
    {"100%", ARG_NONE, "100%"},  {"%q", ARG_NONE, "%q"},     {"%5d", ARG_NONE, "%5d"},
    {"%l", ARG_NONE, "%l"},      {"%llz", ARG_NONE, "%llz"}, {"%z", ARG_NONE, "%z"},
    {"a%%b%", ARG_NONE, "a%b%"}, {"%lq", ARG_NONE, "%lq"},
};

/* fa_buf_vprintf without the format attribute: the formats above include
 * conversions printf does not have. */
static void call_printf(fa_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fa_buf_vprintf(b, fmt, ap);
    va_end(ap);
}

static void expect_bytes(const char *got, size_t n, const char *want, size_t wn)
{
    FZ_CHECK(n == wn && memcmp(got, want, n) == 0);
}

static void check_grouped(const char *got, size_t n, uint64_t v)
{
    char digits[24], want[32];
    int nd = snprintf(digits, sizeof digits, "%llu", (unsigned long long)v);
    size_t k = 0;
    for (int i = 0; i < nd; i++) {
        if (i && (nd - i) % 3 == 0)
            want[k++] = ',';
        want[k++] = digits[i];
    }
    expect_bytes(got, n, want, k);
}

/* `text` is [-]digits[.dec digits] and parses to within half a unit of the
 * last digit of |v| (plus the rounding of a double near 2^64). */
static void check_fixed(const char *got, size_t n, double v, int decimals)
{
    int dec = decimals < 0 ? 0 : decimals > 9 ? 9 : decimals;
    char text[64];
    FZ_CHECK(n < sizeof text);
    memcpy(text, got, n);
    text[n] = '\0';
    const char *c = text + (text[0] == '-');
    size_t nint = strspn(c, "0123456789");
    FZ_CHECK(nint > 0);
    double scale = pow(10, dec);
    if (!isfinite(v))
        v = 0;
    if (fabs(v) >= 1.8e19 / scale) { /* the documented cap: UINT64_MAX, no decimals */
        FZ_CHECK(strcmp(c, "18446744073709551615") == 0);
        return;
    }
    if (dec) {
        FZ_CHECK(c[nint] == '.' && strspn(c + nint + 1, "0123456789") == (size_t)dec && c[nint + 1 + dec] == '\0');
    } else {
        FZ_CHECK(c[nint] == '\0');
    }
    double parsed = strtod(text, NULL);
    FZ_CHECK(fabs(parsed - v) <= 0.5 / scale * (1 + 1e-9) + fabs(v) * 1e-15);
}

static void check_bytes(const char *got, size_t n, uint64_t v)
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    char text[64];
    FZ_CHECK(n < sizeof text);
    memcpy(text, got, n);
    text[n] = '\0';
    if (v < 1024) {
        char want[32];
        int k = snprintf(want, sizeof want, "%llu B", (unsigned long long)v);
        expect_bytes(got, n, want, (size_t)k);
        return;
    }
    char *end;
    double x = strtod(text, &end);
    FZ_CHECK(end > text && end[0] == ' ');
    size_t dot = strcspn(text, ".");
    size_t decimals = dot < (size_t)(end - text) ? (size_t)(end - text) - dot - 1 : 0;
    FZ_CHECK(decimals <= 2);
    int u = 0;
    while (u < 6 && strcmp(end + 1, units[u]) != 0)
        u++;
    FZ_CHECK(u < 6);
    double exact = (double)v / pow(1024, u + 1);
    FZ_CHECK(exact >= 1 && (exact < 1024 || u == 5));
    FZ_CHECK(fabs(x - exact) <= 0.5 / pow(10, (double)decimals) * (1 + 1e-9));
}

/* Decode the JSON string literal got[0..n) (as fa_buf_json_str writes it:
 * \" \\ \n \t, \u00XX for bytes, UTF-8 as itself) and compare it with s. */
static void check_json_str(const char *got, size_t n, const char *s)
{
    FZ_CHECK(fz_json_valid(got, n));
    FZ_CHECK(n >= 2 && got[0] == '"' && got[n - 1] == '"');
    size_t k = 0;
    for (size_t i = 1; i < n - 1; i++, k++) {
        unsigned char c = (unsigned char)got[i];
        FZ_CHECK(c >= 0x20 && c != 0x7f); /* bytes from 0x80: UTF-8 (fz_json_valid) */
        if (c == '\\') {
            char e = got[++i];
            if (e == 'u') {
                FZ_CHECK(strncmp(got + i + 1, "00", 2) == 0);
                char hex[3] = {got[i + 3], got[i + 4], '\0'};
                c = (unsigned char)strtoul(hex, NULL, 16);
                i += 4;
            } else {
                FZ_CHECK(e == '"' || e == '\\' || e == 'n' || e == 't');
                c = e == 'n' ? '\n' : e == 't' ? '\t' : (unsigned char)e;
            }
        }
        FZ_CHECK((unsigned char)s[k] == c);
    }
    FZ_CHECK(s[k] == '\0');
}

static void check_quoted_raw(const char *got, size_t n, const char *s, size_t max)
{
    size_t slen = strlen(s), keep = slen > max ? max : slen;
    if (slen > max) {
        FZ_CHECK(n >= 3 && memcmp(got + n - 3, "...", 3) == 0);
        n -= 3;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++, k++) {
        unsigned char c = (unsigned char)got[i];
        FZ_CHECK(c >= 0x20 && c < 0x7f);
        if (c == '\\') {
            FZ_CHECK(i + 3 < n && got[i + 1] == 'x');
            char hex[3] = {got[i + 2], got[i + 3], '\0'};
            FZ_CHECK(strspn(hex, "0123456789abcdef") == 2);
            c = (unsigned char)strtoul(hex, NULL, 16);
            i += 3;
        }
        FZ_CHECK(k < keep && (unsigned char)s[k] == c);
    }
    FZ_CHECK(k == keep);
}

static void check_printf(fa_buf *small, fa_buf *full, fz_reader *r)
{
    size_t idx = fz_u8(r) % (sizeof formats / sizeof formats[0]);
    const char *fmt = formats[idx].fmt;
    size_t before = full->len;
    char want[600];
    int wn = 0;
    switch (formats[idx].arg) {
    case ARG_NONE:
        call_printf(small, fmt);
        call_printf(full, fmt);
        wn = snprintf(want, sizeof want, "%s", formats[idx].literal);
        break;
    case ARG_STR: {
        char s[MAX_STR + 1];
        fz_str(r, s, MAX_STR);
        const char *arg = s[0] == '\x01' ? NULL : s; /* a leading 0x01 stands for NULL */
        call_printf(small, fmt, arg, arg);
        call_printf(full, fmt, arg, arg);
        wn = snprintf(want, sizeof want, fmt, arg ? arg : "(null)", arg ? arg : "(null)");
        break;
    }
#define ARG_CASE(kind, type, read)                        \
    case kind: {                                          \
        type v = (type)read;                              \
        call_printf(small, fmt, v);                       \
        call_printf(full, fmt, v);                        \
        wn = snprintf(want, sizeof want, fmt, v);         \
        break;                                            \
    }
        ARG_CASE(ARG_CHAR, int, fz_u8(r))
        ARG_CASE(ARG_INT, int, fz_u32(r))
        ARG_CASE(ARG_LONG, long, fz_u64(r))
        ARG_CASE(ARG_LLONG, long long, fz_u64(r))
        ARG_CASE(ARG_UINT, unsigned, fz_u32(r))
        ARG_CASE(ARG_ULONG, unsigned long, fz_u64(r))
        ARG_CASE(ARG_ULLONG, unsigned long long, fz_u64(r))
        ARG_CASE(ARG_SIZE, size_t, fz_u64(r))
        ARG_CASE(ARG_SSIZE, ssize_t, fz_u64(r))
#undef ARG_CASE
    case ARG_PTR: {
        uint64_t v = fz_u64(r);
        call_printf(small, fmt, (void *)(uintptr_t)v);
        call_printf(full, fmt, (void *)(uintptr_t)v);
        wn = snprintf(want, sizeof want, "at 0x%llx", (unsigned long long)v);
        break;
    }
    }
    FZ_CHECK(wn >= 0 && (size_t)wn < sizeof want);
    expect_bytes(full->p + before, full->len - before, want, (size_t)wn);
}

static char ascii_lower(char c) { return c >= 'A' && c <= 'Z' ? (char)(c + 32) : c; }

static void check_streq_nocase(fz_reader *r)
{
    char a[MAX_STR + 1], b[MAX_STR + 1];
    fz_str(r, a, MAX_STR);
    fz_str(r, b, MAX_STR);
    size_t i = 0;
    while (a[i] && ascii_lower(a[i]) == ascii_lower(b[i]))
        i++;
    FZ_CHECK(fa_streq_nocase(a, b) == (ascii_lower(a[i]) == ascii_lower(b[i])));
}

/* One operation on both buffers; returns false when the input is used up. */
static bool one_op(fa_buf *small, fa_buf *full, fz_reader *r)
{
    if (r->n == 0)
        return false;
    uint8_t op = fz_u8(r) % 13;
    const char *added;
    size_t before = full->len;
    char s[MAX_STR + 1];
#define BOTH(call, ...)            \
    do {                           \
        call(small, __VA_ARGS__);  \
        call(full, __VA_ARGS__);   \
        added = full->p + before;  \
    } while (0)
    switch (op) {
    case 0: {
        char c = (char)fz_u8(r);
        BOTH(fa_buf_putc, c);
        expect_bytes(added, full->len - before, &c, 1);
        break;
    }
    case 1: {
        size_t n = fz_u8(r) % 64;
        n = n < r->n ? n : r->n;
        BOTH(fa_buf_mem, (const char *)r->p, n);
        expect_bytes(added, full->len - before, (const char *)r->p, n);
        r->p += n;
        r->n -= n;
        break;
    }
    case 2: {
        fz_str(r, s, MAX_STR);
        const char *arg = s[0] == '\x01' ? NULL : s;
        BOTH(fa_buf_str, arg);
        expect_bytes(added, full->len - before, arg ? arg : "(null)", strlen(arg ? arg : "(null)"));
        break;
    }
    case 3:
    case 4:
    case 5: {
        uint64_t v = fz_u64(r);
        char want[32];
        int wn;
        if (op == 3) {
            BOTH(fa_buf_u64, v);
            wn = snprintf(want, sizeof want, "%llu", (unsigned long long)v);
        } else if (op == 4) {
            BOTH(fa_buf_i64, (int64_t)v);
            wn = snprintf(want, sizeof want, "%lld", (long long)v);
        } else {
            BOTH(fa_buf_hex, v);
            wn = snprintf(want, sizeof want, "%llx", (unsigned long long)v);
        }
        expect_bytes(added, full->len - before, want, (size_t)wn);
        break;
    }
    case 6: {
        uint64_t v = fz_num(r);
        BOTH(fa_buf_grouped, v);
        check_grouped(added, full->len - before, v);
        break;
    }
    case 7: {
        uint64_t bits = fz_u64(r);
        double v;
        memcpy(&v, &bits, sizeof v);
        int decimals = (int)(fz_u8(r) % 13) - 2;
        BOTH(fa_buf_fixed, v, decimals);
        check_fixed(added, full->len - before, v, decimals);
        break;
    }
    case 8: {
        uint64_t v = fz_num(r);
        BOTH(fa_buf_bytes, v);
        check_bytes(added, full->len - before, v);
        break;
    }
    case 9: {
        fz_str(r, s, MAX_STR);
        const char *arg = s[0] == '\x01' ? NULL : s;
        BOTH(fa_buf_json_str, arg);
        check_json_str(added, full->len - before, arg ? arg : "");
        break;
    }
    case 10: {
        size_t max = fz_u8(r);
        fz_str(r, s, MAX_STR);
        BOTH(fa_buf_quoted_raw, s, max);
        check_quoted_raw(added, full->len - before, s, max);
        break;
    }
    case 11: check_printf(small, full, r); break;
    case 12: check_streq_nocase(r); break;
    }
#undef BOTH
    fz_check_truncation(small, full);
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_reader r = {data, size};
    size_t cap = fz_u8(&r) % 65;
    char *small_store = malloc(cap);
    fa_buf small, full;
    fa_buf_init(&small, small_store, cap);
    fa_buf_init(&full, full_store, sizeof full_store);
    for (int i = 0; i < MAX_OPS && one_op(&small, &full, &r); i++)
        continue;
    free(small_store);
    return 0;
}
