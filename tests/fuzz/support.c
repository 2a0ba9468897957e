/* support.c - shared pieces of the fuzz harnesses (see support.h). */
#include "support.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../src/core/options.h"

/* Present when a sanitizer runtime is linked in. */
extern void __sanitizer_set_report_fd(void *fd) __attribute__((weak));

static int devnull_fd = -1, stderr_copy = -1;

_Noreturn void fz_fail(const char *what, const char *file, int line)
{
    dprintf(stderr_copy >= 0 ? stderr_copy : 2, "%s:%d: check failed: %s\n", file, line, what);
    abort();
}

/* ---- reading fields --------------------------------------------------- */

uint8_t fz_u8(fz_reader *r)
{
    if (!r->n)
        return 0;
    r->n--;
    return *r->p++;
}

uint32_t fz_u32(fz_reader *r)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)fz_u8(r) << (8 * i);
    return v;
}

uint64_t fz_u64(fz_reader *r)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)fz_u8(r) << (8 * i);
    return v;
}

uint64_t fz_num(fz_reader *r)
{
    uint8_t tag = fz_u8(r);
    if (tag < 0x80)
        return tag;
    uint64_t v = 0;
    for (int i = 0; i <= (tag & 7); i++)
        v |= (uint64_t)fz_u8(r) << (8 * i);
    return v;
}

size_t fz_str(fz_reader *r, char *out, size_t max)
{
    size_t len = fz_u8(r);
    if (max > 255)
        len |= (size_t)fz_u8(r) << 8;
    len %= max + 1;
    if (len > r->n)
        len = r->n;
    memcpy(out, r->p, len);
    out[len] = '\0';
    r->p += len;
    r->n -= len;
    return len;
}

/* ---- environment blocks ----------------------------------------------- */

void fz_env_make(fz_env *e, const uint8_t *data, size_t n)
{
    e->text = malloc(n + 1);
    e->envp = malloc((FZ_ENV_MAX + 1) * sizeof *e->envp);
    if (!e->text || !e->envp)
        abort();
    memcpy(e->text, data, n);
    e->text[n] = '\0';
    e->count = 0;
    char *start = e->text;
    for (size_t i = 0; i <= n && e->count < FZ_ENV_MAX; i++) {
        if (i == n || e->text[i] == '\0' || e->text[i] == '\n') {
            e->text[i] = '\0';
            e->envp[e->count++] = start;
            start = e->text + i + 1;
        }
    }
    e->envp[e->count] = NULL;
}

void fz_env_free(fz_env *e)
{
    free(e->text);
    free(e->envp);
}

void fz_options_init(void)
{
    devnull_fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
    stderr_copy = fcntl(2, F_DUPFD_CLOEXEC, 3);
    if (devnull_fd < 0 || stderr_copy < 0)
        abort();
    if (__sanitizer_set_report_fd)
        __sanitizer_set_report_fd((void *)(intptr_t)stderr_copy);
    char *none[] = {NULL};
    fz_options_load_quietly(none);
}

int fz_options_load_quietly(char *const *envp)
{
    FZ_CHECK(devnull_fd >= 0); /* fz_options_init first */
    if (dup2(devnull_fd, 2) < 0)
        abort();
    int bad = fa_options_load(envp);
    if (dup2(stderr_copy, 2) < 0)
        abort();
    return bad;
}

/* ---- fa_buf ----------------------------------------------------------- */

void fz_check_truncation(const fa_buf *small, const fa_buf *full)
{
    FZ_CHECK(!fa_buf_overflowed(full));
    FZ_CHECK(full->len < full->cap && full->p[full->len] == '\0');
    FZ_CHECK(small->need == full->need);
    FZ_CHECK(small->need >= small->len);
    if (small->cap == 0) {
        FZ_CHECK(small->len == 0);
        return;
    }
    size_t fits = full->len < small->cap - 1 ? full->len : small->cap - 1;
    FZ_CHECK(small->len == fits);
    FZ_CHECK(small->p[small->len] == '\0');
    FZ_CHECK(memcmp(small->p, full->p, small->len) == 0);
}

/* ---- UTF-8 and JSON --------------------------------------------------- */

/* Length of the well-formed UTF-8 sequence at s (at most n bytes): 1 to 4,
 * or 0 when it is malformed (overlong, surrogate, beyond U+10FFFF, cut). */
static size_t utf8_seq(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    if (n == 0)
        return 0;
    if (u[0] < 0x80)
        return 1;
    size_t len;
    unsigned char lo = 0x80, hi = 0xbf; /* allowed range of the second byte */
    if (u[0] >= 0xc2 && u[0] <= 0xdf) {
        len = 2;
    } else if (u[0] >= 0xe0 && u[0] <= 0xef) {
        len = 3;
        if (u[0] == 0xe0)
            lo = 0xa0; /* overlong */
        if (u[0] == 0xed)
            hi = 0x9f; /* surrogates */
    } else if (u[0] >= 0xf0 && u[0] <= 0xf4) {
        len = 4;
        if (u[0] == 0xf0)
            lo = 0x90; /* overlong */
        if (u[0] == 0xf4)
            hi = 0x8f; /* beyond U+10FFFF */
    } else {
        return 0;
    }
    if (n < len || u[1] < lo || u[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if (u[i] < 0x80 || u[i] > 0xbf)
            return 0;
    return len;
}

bool fz_utf8_valid(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq(s + i, n - i);
        if (k == 0 || s[i] == '\0')
            return false;
        i += k;
    }
    return true;
}

typedef struct json_parser {
    const char *p, *end;
    int depth;
} json_parser;

static bool json_value(json_parser *j);

static bool json_at(json_parser *j, char c) { return j->p < j->end && *j->p == c; }

static void json_ws(json_parser *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

static bool json_digits(json_parser *j)
{
    const char *start = j->p;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
        j->p++;
    return j->p > start;
}

static bool json_number(json_parser *j)
{
    if (json_at(j, '-'))
        j->p++;
    if (json_at(j, '0'))
        j->p++;
    else if (!(j->p < j->end && *j->p >= '1' && *j->p <= '9') || !json_digits(j))
        return false;
    if (json_at(j, '.')) {
        j->p++;
        if (!json_digits(j))
            return false;
    }
    if (json_at(j, 'e') || json_at(j, 'E')) {
        j->p++;
        if (json_at(j, '+') || json_at(j, '-'))
            j->p++;
        if (!json_digits(j))
            return false;
    }
    return true;
}

static bool json_string(json_parser *j)
{
    if (!json_at(j, '"'))
        return false;
    j->p++;
    while (j->p < j->end) {
        unsigned char c = (unsigned char)*j->p;
        if (c == '"') {
            j->p++;
            return true;
        }
        if (c < 0x20)
            return false;
        if (c == '\\') {
            if (++j->p >= j->end)
                return false;
            if (*j->p == 'u') {
                for (int i = 1; i <= 4; i++) {
                    char h = j->p + i < j->end ? j->p[i] : '\0';
                    if (!((h >= '0' && h <= '9') || (h >= 'a' && h <= 'f') || (h >= 'A' && h <= 'F')))
                        return false;
                }
                j->p += 5;
            } else if (*j->p && strchr("\"\\/bfnrt", *j->p)) {
                j->p++;
            } else {
                return false;
            }
            continue;
        }
        size_t k = utf8_seq(j->p, (size_t)(j->end - j->p));
        if (k == 0)
            return false;
        j->p += k;
    }
    return false;
}

static bool json_word(json_parser *j, const char *w)
{
    size_t n = strlen(w);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, w, n) != 0)
        return false;
    j->p += n;
    return true;
}

/* Object when close == '}', array when close == ']'; j->p is past the opener. */
static bool json_container(json_parser *j, char close)
{
    if (++j->depth > 64)
        return false;
    json_ws(j);
    if (json_at(j, close)) {
        j->p++;
        j->depth--;
        return true;
    }
    for (;;) {
        if (close == '}') {
            if (!json_string(j))
                return false;
            json_ws(j);
            if (!json_at(j, ':'))
                return false;
            j->p++;
        }
        if (!json_value(j))
            return false;
        json_ws(j);
        if (json_at(j, close)) {
            j->p++;
            j->depth--;
            return true;
        }
        if (!json_at(j, ','))
            return false;
        j->p++;
        json_ws(j);
    }
}

static bool json_value(json_parser *j)
{
    json_ws(j);
    if (j->p >= j->end)
        return false;
    switch (*j->p) {
    case '{': j->p++; return json_container(j, '}');
    case '[': j->p++; return json_container(j, ']');
    case '"': return json_string(j);
    case 't': return json_word(j, "true");
    case 'f': return json_word(j, "false");
    case 'n': return json_word(j, "null");
    default: return json_number(j);
    }
}

bool fz_json_valid(const char *s, size_t n)
{
    json_parser j = {s, s + n, 0};
    if (!json_value(&j))
        return false;
    json_ws(&j);
    return j.p == j.end;
}
