/* fmt.h - bounded text formatting into caller-owned buffers.
 *
 * Everything the library prints (log lines, stats dumps, option help) is
 * built here: no malloc, no stdio, no locks, so it is safe inside malloc,
 * at exit and in a signal handler.  A buffer that fills up keeps what fits
 * and remembers that it overflowed. */
#ifndef FA_FMT_H
#define FA_FMT_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct fa_buf {
    char *p;       /* storage, always NUL-terminated when cap > 0 */
    size_t len;    /* bytes written so far (excluding the NUL) */
    size_t cap;    /* size of p */
    size_t need;   /* bytes the full output would take (excluding the NUL) */
} fa_buf;

void fa_buf_init(fa_buf *b, char *storage, size_t cap);
static inline bool fa_buf_overflowed(const fa_buf *b) { return b->need > b->len; }

void fa_buf_putc(fa_buf *b, char c);
void fa_buf_mem(fa_buf *b, const char *s, size_t n);
void fa_buf_str(fa_buf *b, const char *s);
void fa_buf_u64(fa_buf *b, uint64_t v);
void fa_buf_i64(fa_buf *b, int64_t v);
void fa_buf_hex(fa_buf *b, uint64_t v);
/* Fixed-point decimal with `decimals` digits (0..9); NaN/inf print as 0. */
void fa_buf_fixed(fa_buf *b, double v, int decimals);
/* 1536 -> "1.5 KiB"; below 1 KiB prints "N B". */
void fa_buf_bytes(fa_buf *b, uint64_t v);
/* 1234567 -> "1,234,567". */
void fa_buf_grouped(fa_buf *b, uint64_t v);
/* The length of the well-formed UTF-8 sequence at c (RFC 3629: no
 * overlong forms, no surrogates, nothing above U+10FFFF), 0 if none; c is
 * NUL-terminated. */
size_t fa_utf8_len(const unsigned char *c);
/* JSON string literal with quotes: UTF-8 text as itself, control bytes and
 * bytes that are not UTF-8 escaped (\u00XX). */
void fa_buf_json_str(fa_buf *b, const char *s);
/* Printable rendering of untrusted text (environment values): bytes outside
 * printable ASCII become \xNN, and more than `max` input bytes end in "...". */
void fa_buf_quoted_raw(fa_buf *b, const char *s, size_t max);

/* A small printf: %s %c %d %i %u %x %p %% with the length modifiers l, ll
 * and z.  Anything else is copied literally. */
void fa_buf_printf(fa_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void fa_buf_vprintf(fa_buf *b, const char *fmt, va_list ap);

/* Parse helpers shared by the option parser. */
bool fa_streq_nocase(const char *a, const char *b);

#endif
