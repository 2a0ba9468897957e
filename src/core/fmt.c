/* fmt.c - bounded text formatting (see fmt.h). */
#include "fmt.h"

#include <math.h>
#include <string.h>

void fa_buf_init(fa_buf *b, char *storage, size_t cap)
{
    b->p = storage;
    b->len = 0;
    b->cap = cap;
    b->need = 0;
    if (cap)
        storage[0] = '\0';
}

void fa_buf_mem(fa_buf *b, const char *s, size_t n)
{
    b->need += n;
    if (b->cap == 0)
        return;
    size_t room = b->cap - 1 - b->len;
    if (b->len != b->need - n) /* already overflowed: keep the prefix intact */
        return;
    size_t k = n < room ? n : room;
    memcpy(b->p + b->len, s, k);
    b->len += k;
    b->p[b->len] = '\0';
}

void fa_buf_putc(fa_buf *b, char c) { fa_buf_mem(b, &c, 1); }

void fa_buf_str(fa_buf *b, const char *s) { fa_buf_mem(b, s ? s : "(null)", strlen(s ? s : "(null)")); }

void fa_buf_u64(fa_buf *b, uint64_t v)
{
    char tmp[24];
    int i = sizeof tmp;
    do {
        tmp[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    fa_buf_mem(b, tmp + i, sizeof tmp - (size_t)i);
}

void fa_buf_i64(fa_buf *b, int64_t v)
{
    if (v < 0) {
        fa_buf_putc(b, '-');
        fa_buf_u64(b, (uint64_t)0 - (uint64_t)v);
    } else {
        fa_buf_u64(b, (uint64_t)v);
    }
}

void fa_buf_hex(fa_buf *b, uint64_t v)
{
    static const char digits[] = "0123456789abcdef";
    char tmp[16];
    int i = sizeof tmp;
    do {
        tmp[--i] = digits[v & 15];
        v >>= 4;
    } while (v);
    fa_buf_mem(b, tmp + i, sizeof tmp - (size_t)i);
}

void fa_buf_fixed(fa_buf *b, double v, int decimals)
{
    if (!isfinite(v))
        v = 0;
    if (decimals < 0)
        decimals = 0;
    if (decimals > 9)
        decimals = 9;
    if (v < 0) {
        fa_buf_putc(b, '-');
        v = -v;
    }
    uint64_t scale = 1;
    for (int i = 0; i < decimals; i++)
        scale *= 10;
    if (v >= 1.8e19 / (double)scale) { /* beyond uint64: print the integer part only */
        fa_buf_u64(b, UINT64_MAX);
        return;
    }
    uint64_t scaled = (uint64_t)(v * (double)scale + 0.5);
    fa_buf_u64(b, scaled / scale);
    if (decimals) {
        char tmp[10];
        uint64_t frac = scaled % scale;
        for (int i = decimals - 1; i >= 0; i--) {
            tmp[i] = (char)('0' + frac % 10);
            frac /= 10;
        }
        fa_buf_putc(b, '.');
        fa_buf_mem(b, tmp, (size_t)decimals);
    }
}

void fa_buf_bytes(fa_buf *b, uint64_t v)
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (v < 1024) {
        fa_buf_u64(b, v);
        fa_buf_str(b, " B");
        return;
    }
    double x = (double)v;
    int u = -1;
    while (x >= 1024.0 && u < 5) {
        x /= 1024.0;
        u++;
    }
    fa_buf_fixed(b, x, x < 10 ? 2 : x < 100 ? 1 : 0);
    fa_buf_putc(b, ' ');
    fa_buf_str(b, units[u]);
}

void fa_buf_grouped(fa_buf *b, uint64_t v)
{
    char tmp[32];
    int i = sizeof tmp, n = 0;
    do {
        if (n && n % 3 == 0)
            tmp[--i] = ',';
        tmp[--i] = (char)('0' + v % 10);
        v /= 10;
        n++;
    } while (v);
    fa_buf_mem(b, tmp + i, sizeof tmp - (size_t)i);
}

size_t fa_utf8_len(const unsigned char *c)
{
    unsigned char lo = 0x80, hi = 0xbf;
    size_t n;
    if (c[0] >= 0xc2 && c[0] <= 0xdf)
        n = 2;
    else if (c[0] >= 0xe0 && c[0] <= 0xef)
        n = 3, lo = c[0] == 0xe0 ? 0xa0 : 0x80, hi = c[0] == 0xed ? 0x9f : 0xbf;
    else if (c[0] >= 0xf0 && c[0] <= 0xf4)
        n = 4, lo = c[0] == 0xf0 ? 0x90 : 0x80, hi = c[0] == 0xf4 ? 0x8f : 0xbf;
    else
        return 0;
    if (c[1] < lo || c[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (c[i] < 0x80 || c[i] > 0xbf)
            return 0;
    return n;
}

/* Anything but the four escapes at c: a UTF-8 sequence as itself (a path
 * such as AI绘画/webui reads as written), any other byte below 0x20 or
 * from 0x7f as \u00XX, so the output stays valid JSON for any input
 * (paths that are not UTF-8 included).  Returns the bytes taken. */
static size_t json_other(fa_buf *b, const unsigned char *c)
{
    size_t n = *c >= 0x80 ? fa_utf8_len(c) : 0;
    if (n) {
        fa_buf_mem(b, (const char *)c, n);
        return n;
    }
    if (*c < 0x20 || *c >= 0x7f) {
        fa_buf_str(b, "\\u00");
        fa_buf_putc(b, "0123456789abcdef"[*c >> 4]);
        fa_buf_putc(b, "0123456789abcdef"[*c & 15]);
    } else {
        fa_buf_putc(b, (char)*c);
    }
    return 1;
}

void fa_buf_json_str(fa_buf *b, const char *s)
{
    fa_buf_putc(b, '"');
    for (const unsigned char *c = (const unsigned char *)(s ? s : ""); *c;) {
        switch (*c) {
        case '"': fa_buf_str(b, "\\\""); break;
        case '\\': fa_buf_str(b, "\\\\"); break;
        case '\n': fa_buf_str(b, "\\n"); break;
        case '\t': fa_buf_str(b, "\\t"); break;
        default: c += json_other(b, c); continue;
        }
        c++;
    }
    fa_buf_putc(b, '"');
}

void fa_buf_quoted_raw(fa_buf *b, const char *s, size_t max)
{
    size_t i = 0;
    for (const unsigned char *c = (const unsigned char *)s; *c; c++, i++) {
        if (i == max) {
            fa_buf_str(b, "...");
            return;
        }
        if (*c < 0x20 || *c >= 0x7f || *c == '\\') {
            fa_buf_str(b, "\\x");
            fa_buf_putc(b, "0123456789abcdef"[*c >> 4]);
            fa_buf_putc(b, "0123456789abcdef"[*c & 15]);
        } else {
            fa_buf_putc(b, (char)*c);
        }
    }
}

void fa_buf_vprintf(fa_buf *b, const char *fmt, va_list ap)
{
    for (const char *f = fmt; *f; f++) {
        if (*f != '%') {
            const char *run = f;
            while (f[1] && f[1] != '%')
                f++;
            fa_buf_mem(b, run, (size_t)(f - run + 1));
            continue;
        }
        const char *spec = f++;
        int lng = 0, sz = 0;
        while (*f == 'l') {
            lng++;
            f++;
        }
        if (*f == 'z') {
            sz = 1;
            f++;
        }
        switch (*f) {
        case 's': fa_buf_str(b, va_arg(ap, const char *)); break;
        case 'c': fa_buf_putc(b, (char)va_arg(ap, int)); break;
        case '%': fa_buf_putc(b, '%'); break;
        case 'd':
        case 'i':
            if (sz)
                fa_buf_i64(b, (int64_t)va_arg(ap, long));
            else if (lng >= 2)
                fa_buf_i64(b, va_arg(ap, long long));
            else if (lng == 1)
                fa_buf_i64(b, va_arg(ap, long));
            else
                fa_buf_i64(b, va_arg(ap, int));
            break;
        case 'u':
        case 'x': {
            uint64_t v;
            if (sz)
                v = va_arg(ap, size_t);
            else if (lng >= 2)
                v = va_arg(ap, unsigned long long);
            else if (lng == 1)
                v = va_arg(ap, unsigned long);
            else
                v = va_arg(ap, unsigned);
            if (*f == 'u')
                fa_buf_u64(b, v);
            else
                fa_buf_hex(b, v);
            break;
        }
        case 'p':
            fa_buf_str(b, "0x");
            fa_buf_hex(b, (uint64_t)(uintptr_t)va_arg(ap, void *));
            break;
        default: /* unknown conversion: copy it as written */
            if (!*f)
                f--;
            fa_buf_mem(b, spec, (size_t)(f - spec + 1));
        }
    }
}

void fa_buf_printf(fa_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fa_buf_vprintf(b, fmt, ap);
    va_end(ap);
}

bool fa_streq_nocase(const char *a, const char *b)
{
    for (; *a && *b; a++, b++) {
        char x = *a >= 'A' && *a <= 'Z' ? (char)(*a + 32) : *a;
        char y = *b >= 'A' && *b <= 'Z' ? (char)(*b + 32) : *b;
        if (x != y)
            return false;
    }
    return *a == *b;
}
