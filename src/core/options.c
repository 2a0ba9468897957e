/* options.c - parse FORGEALLOC_* settings from the one table (options.def).
 *
 * Whole values must parse: "12X", "1e9", "-1" or "10 apples" are rejected
 * with one line naming the variable, and the default is used instead.
 * Sizes are binary (1K = 1024) and checked for overflow. */
#define _GNU_SOURCE
#include "options.h"

#include <limits.h>
#include <sched.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

#define FA_PATH_MAX 4096

const fa_option_desc fa_option_table[FA_OPT_COUNT] = {
#define FA_OPTION(id, type, def, min, max, choices, scope, doc) \
    [FA_OPT_##id] = {"FORGEALLOC_" #id, FA_TYPE_##type, def, min, max, choices, FA_SCOPE_##scope, doc},
#include "options.def"
#undef FA_OPTION
};

static fa_optval values[FA_OPT_COUNT];
static char path_store[FA_OPT_COUNT][FA_PATH_MAX];
static int invalid_count;
static int unknown_count; /* FORGEALLOC_* names that are no setting (a misspelling) */
static int load_state; /* 0 = not loaded, 1 = loading, 2 = loaded */
/* The table's defaults, parsed once: what other threads read while one
 * thread loads the environment into `values`. */
static fa_optval defaults[FA_OPT_COUNT];
static int defaults_state; /* 0 = not parsed, 1 = parsing, 2 = ready */
static pid_t loader_tid;   /* the thread loading `values` (it reads them as they fill) */

extern char **environ;

/* ---- parsing ---------------------------------------------------------- */

static const char *skip_ws(const char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    return s;
}

/* Why a value that reads as a number is refused (*why of the parsers, the
 * message's phrase in place of the expected kind). */
static const char too_precise[] = "a value with at most 9 decimals";
static const char too_short[] =
    "0 or a duration of at least 1 ms (a shorter one would round to 0, which has its own meaning)";

/* Decimal number "123" or "1.25": at most 18 integer digits and 9 decimals
 * (zeros past the 9th are fine, other digits are refused: *why).  Returns
 * the end, or NULL when there is no number. */
static const char *parse_decimal(const char *s, uint64_t *ip, uint64_t *frac, int *fdigits, const char **why)
{
    uint64_t v = 0, f = 0;
    int nd = 0, nf = 0;
    for (; *s >= '0' && *s <= '9'; s++, nd++) {
        if (nd >= 18)
            return NULL;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    if (*s == '.') {
        s++;
        for (; *s >= '0' && *s <= '9'; s++) {
            if (nf < 9) {
                f = f * 10 + (uint64_t)(*s - '0');
                nf++;
            } else if (*s != '0') {
                *why = too_precise;
                return NULL;
            }
        }
        if (nf == 0 && nd == 0)
            return NULL;
    }
    if (nd == 0 && nf == 0)
        return NULL;
    *ip = v;
    *frac = f;
    *fdigits = nf;
    return s;
}

static double decimal_value(uint64_t ip, uint64_t frac, int fdigits)
{
    double d = (double)frac;
    for (int i = 0; i < fdigits; i++)
        d /= 10.0;
    return (double)ip + d;
}

static bool parse_size(const char *text, uint64_t *out, const char **why)
{
    uint64_t ip, frac;
    int nf;
    const char *s = parse_decimal(skip_ws(text), &ip, &frac, &nf, why);
    if (!s)
        return false;
    s = skip_ws(s);
    int shift = 0;
    switch (*s | 0x20) {
    case 'k': shift = 10; s++; break;
    case 'm': shift = 20; s++; break;
    case 'g': shift = 30; s++; break;
    case 't': shift = 40; s++; break;
    default: break;
    }
    if (shift && (*s | 0x20) == 'i' && (s[1] | 0x20) == 'b')
        s += 2;
    else if ((*s | 0x20) == 'b')
        s++;
    if (*skip_ws(s))
        return false;
    if (shift == 0 && nf && frac) /* fractional bytes */
        return false;
    if (ip > (UINT64_MAX >> shift))
        return false;
    uint64_t v = ip << shift;
    if (nf) {
        uint64_t div = 1;
        for (int i = 0; i < nf; i++)
            div *= 10;
        /* frac < div <= 1e9 and shift <= 40: frac << shift fits in 64 bits */
        uint64_t add = (uint64_t)(((unsigned __int128)frac << shift) / div);
        if (v + add < v)
            return false;
        v += add;
    }
    *out = v;
    return true;
}

static bool parse_number(const char *text, double min, double max, double *out, const char **why)
{
    uint64_t ip, frac;
    int nf;
    const char *s = parse_decimal(skip_ws(text), &ip, &frac, &nf, why);
    if (!s || *skip_ws(s))
        return false;
    double d = decimal_value(ip, frac, nf);
    if (d < min || d > max)
        return false;
    *out = d;
    return true;
}

static bool parse_seconds(const char *text, double min, double max, uint64_t *ms, const char **why)
{
    uint64_t ip, frac;
    int nf;
    const char *s = parse_decimal(skip_ws(text), &ip, &frac, &nf, why);
    if (!s)
        return false;
    double d = decimal_value(ip, frac, nf);
    s = skip_ws(s);
    if ((s[0] | 0x20) == 'm' && (s[1] | 0x20) == 's') {
        d /= 1000.0;
        s += 2;
    } else if ((s[0] | 0x20) == 's') {
        s++;
    } else if ((s[0] | 0x20) == 'm') {
        d *= 60.0;
        s++;
    }
    if (*skip_ws(s) || d < min || d > max)
        return false;
    *ms = (uint64_t)(d * 1000.0 + 0.5);
    if (*ms == 0 && d > 0) {
        /* 0 is a mode of its own (at once, only at exit): never by rounding. */
        *why = too_short;
        return false;
    }
    return true;
}

/* text without the blanks around it into word (cap bytes), as sizes and
 * numbers skip them; false when it does not fit. */
static bool trimmed(const char *text, char *word, size_t cap)
{
    text = skip_ws(text);
    size_t n = strlen(text);
    while (n && (text[n - 1] == ' ' || text[n - 1] == '\t'))
        n--;
    if (n >= cap)
        return false;
    memcpy(word, text, n);
    word[n] = '\0';
    return true;
}

static bool parse_bool(const char *text, uint64_t *out)
{
    static const char *const yes[] = {"1", "true", "yes", "on"};
    static const char *const no[] = {"0", "false", "no", "off"};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
        if (fa_streq_nocase(text, yes[i])) {
            *out = 1;
            return true;
        }
        if (fa_streq_nocase(text, no[i])) {
            *out = 0;
            return true;
        }
    }
    return false;
}

static bool parse_enum(const char *text, const char *choices, uint64_t *out)
{
    uint64_t idx = 0;
    const char *c = choices;
    while (*c) {
        const char *end = strchr(c, '|');
        size_t n = end ? (size_t)(end - c) : strlen(c);
        size_t i = 0;
        while (i < n && text[i] && (text[i] | 0x20) == c[i])
            i++;
        if (i == n && text[i] == '\0') {
            *out = idx;
            return true;
        }
        idx++;
        c += n + (end ? 1 : 0);
    }
    return false;
}

/* The SIZE rules of the table: [min, max] bytes (unbounded when both are
 * 0) and, for SIZE_POW2, a power of two. */
static bool size_in_range(const fa_option_desc *d, uint64_t v)
{
    bool bounded = d->min != 0 || d->max != 0;
    if (bounded && ((double)v < d->min || (double)v > d->max))
        return false;
    return d->type != FA_TYPE_SIZE_POW2 || (v && (v & (v - 1)) == 0);
}

bool fa_option_parse(const fa_option_desc *d, const char *text, fa_optval *out, const char **expected)
{
    fa_optval v = {0};
    v.src = FA_SRC_ENV;
    bool ok = false;
    const char *why = NULL;
    switch (d->type) {
    case FA_TYPE_SIZE:
    case FA_TYPE_SIZE_POW2:
        *expected = d->type == FA_TYPE_SIZE_POW2 ? "a power of two (use 64M, 256MiB or 1G)"
                                                 : "a size (use 4G, 512MiB or 1048576)";
        ok = parse_size(text, &v.u, &why) && size_in_range(d, v.u);
        break;
    case FA_TYPE_SIZE_PCT: {
        *expected = "a size or a percentage (use 4G, 512MiB or 40%)";
        size_t n = strlen(text);
        const char *t = text;
        while (n && (t[n - 1] == ' ' || t[n - 1] == '\t'))
            n--;
        if (n && t[n - 1] == '%') {
            char tmp[64];
            if (n - 1 >= sizeof tmp)
                break;
            memcpy(tmp, t, n - 1);
            tmp[n - 1] = '\0';
            ok = parse_number(tmp, d->min, d->max, &v.d, &why);
            v.is_pct = true;
        } else {
            ok = parse_size(text, &v.u, &why);
        }
        break;
    }
    case FA_TYPE_NUM:
    case FA_TYPE_INT:
        *expected = d->type == FA_TYPE_INT ? "a whole number" : "a number";
        ok = parse_number(text, d->min, d->max, &v.d, &why) && (d->type == FA_TYPE_NUM || v.d == (double)(uint64_t)v.d);
        v.u = (uint64_t)v.d;
        if (d->type == FA_TYPE_INT)
            why = NULL; /* "is not a whole number" says it */
        break;
    case FA_TYPE_SECONDS:
        *expected = "a duration (use 30, 1.5s, 500ms or 2m)";
        ok = parse_seconds(text, d->min, d->max, &v.u, &why);
        break;
    case FA_TYPE_BOOL: {
        *expected = "a boolean (use 1 or 0, true or false, yes or no, on or off)";
        char word[16];
        ok = trimmed(text, word, sizeof word) && parse_bool(word, &v.u);
        break;
    }
    case FA_TYPE_ENUM: {
        *expected = d->choices;
        char word[32];
        ok = trimmed(text, word, sizeof word) && parse_enum(word, d->choices, &v.u);
        break;
    }
    case FA_TYPE_PATH:
        *expected = "a path (or - for stderr)";
        ok = text[0] != '\0' && strlen(text) < FA_PATH_MAX;
        v.s = text;
        break;
    }
    if (ok)
        *out = v;
    else if (why)
        *expected = why;
    return ok;
}

/* ---- loading ---------------------------------------------------------- */

static fa_optval parse_default(enum fa_opt_id id)
{
    const char *expected;
    fa_optval v = {0};
    if (!fa_option_parse(&fa_option_table[id], fa_option_table[id].def, &v, &expected))
        v = (fa_optval){0}; /* empty defaults (launcher paths) */
    if (fa_option_table[id].type == FA_TYPE_PATH)
        v.s = fa_option_table[id].def;
    v.src = FA_SRC_DEFAULT;
    return v;
}

/* Parse the defaults once (pure computation, no I/O): a thread that
 * finds another parsing them waits the few microseconds it takes. */
static void defaults_ready(void)
{
    if (__atomic_load_n(&defaults_state, __ATOMIC_ACQUIRE) == 2)
        return;
    int expect = 0;
    if (__atomic_compare_exchange_n(&defaults_state, &expect, 1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        for (int i = 0; i < FA_OPT_COUNT; i++)
            defaults[i] = parse_default((enum fa_opt_id)i);
        __atomic_store_n(&defaults_state, 2, __ATOMIC_RELEASE);
        return;
    }
    while (__atomic_load_n(&defaults_state, __ATOMIC_ACQUIRE) != 2)
        sched_yield();
}

static void set_default(enum fa_opt_id id) { values[id] = defaults[id]; }

/* Writes the kind of value (the part of `expected` before its examples),
 * then `range`, then the examples. */
static void kind_range_examples(fa_buf *b, const char *expected, void (*range)(fa_buf *, const fa_option_desc *),
                                const fa_option_desc *d)
{
    const char *examples = strstr(expected, " (");
    size_t kind = examples ? (size_t)(examples - expected) : strlen(expected);
    fa_buf_mem(b, expected, kind);
    range(b, d);
    if (examples)
        fa_buf_str(b, examples);
}

/* " from 1.00 MiB to 1.00 TiB" */
static void byte_range(fa_buf *b, const fa_option_desc *d)
{
    fa_buf_str(b, " from ");
    fa_buf_bytes(b, (uint64_t)d->min);
    fa_buf_str(b, " to ");
    fa_buf_bytes(b, (uint64_t)d->max);
}

/* " from 0 to 10", with " seconds" for durations */
static void number_range(fa_buf *b, const fa_option_desc *d)
{
    fa_buf_str(b, " from ");
    fa_buf_fixed(b, d->min, 0);
    fa_buf_str(b, " to ");
    fa_buf_fixed(b, d->max, 0);
    if (d->type == FA_TYPE_SECONDS)
        fa_buf_str(b, " seconds");
}

/* " from 0% to 100%" */
static void percent_range(fa_buf *b, const fa_option_desc *d)
{
    fa_buf_str(b, " from ");
    fa_buf_fixed(b, d->min, 0);
    fa_buf_str(b, "% to ");
    fa_buf_fixed(b, d->max, 0);
    fa_buf_putc(b, '%');
}

static void expected_phrase(fa_buf *b, const fa_option_desc *d, const char *expected)
{
    if (expected == too_precise || expected == too_short) {
        fa_buf_str(b, expected); /* why the value is refused: no range to add */
    } else if (d->type == FA_TYPE_ENUM) {
        fa_buf_str(b, "one of ");
        for (const char *c = expected; *c; c++) {
            if (*c == '|')
                fa_buf_str(b, ", ");
            else
                fa_buf_putc(b, *c);
        }
    } else if ((d->type == FA_TYPE_SIZE || d->type == FA_TYPE_SIZE_POW2) && (d->min != 0 || d->max != 0)) {
        /* "a power of two from 1.00 MiB to 1.00 TiB (use 64M, ...)": the
         * range belongs to the kind of value, before the examples. */
        kind_range_examples(b, expected, byte_range, d);
    } else if (d->type == FA_TYPE_SIZE_PCT) {
        /* "a size or a percentage from 0% to 100% (use 4G, ...)" */
        kind_range_examples(b, expected, percent_range, d);
    } else if (d->type == FA_TYPE_NUM || d->type == FA_TYPE_INT || d->type == FA_TYPE_SECONDS) {
        kind_range_examples(b, expected, number_range, d);
    } else {
        fa_buf_str(b, expected);
    }
}

static void apply(char *const *envp, enum fa_opt_id id, const char *text)
{
    const fa_option_desc *d = &fa_option_table[id];
    const char *expected = "";
    fa_optval v;
    if (fa_option_parse(d, text, &v, &expected)) {
        if (d->type == FA_TYPE_PATH) {
            memcpy(path_store[id], text, strlen(text) + 1);
            v.s = path_store[id];
        }
        values[id] = v;
        return;
    }
    invalid_count++;
    values[id].src = FA_SRC_INVALID;
    char m[600], defbuf[64];
    fa_buf b, dv;
    fa_buf_init(&b, m, sizeof m);
    fa_buf_init(&dv, defbuf, sizeof defbuf);
    fa_option_format(&dv, id);
    fa_buf_printf(&b, "%s='", d->name);
    fa_buf_quoted_raw(&b, text, 64);
    fa_buf_str(&b, text[0] ? "' is not " : "' is empty; expected ");
    expected_phrase(&b, d, expected);
    /* Refusing to start is told in every process; a warning only by the
     * first process of a tree started with this value. */
    if (values[FA_OPT_STRICT].u)
        fa_error("%s; default would be %s", m, defbuf);
    else
        fa_warn_tree(envp, &d->name, 1, "%s; using %s", m, defbuf);
}

static int find_option(const char *entry, size_t namelen)
{
    for (int i = 0; i < FA_OPT_COUNT; i++) {
        const char *n = fa_option_table[i].name;
        if (strlen(n) == namelen && memcmp(n, entry, namelen) == 0)
            return i;
    }
    return -1;
}

/* The value of `id` in envp (first occurrence), or NULL. */
static const char *lookup(char *const *envp, enum fa_opt_id id)
{
    size_t n = strlen(fa_option_table[id].name);
    for (char *const *e = envp; e && *e; e++)
        if (strncmp(*e, fa_option_table[id].name, n) == 0 && (*e)[n] == '=')
            return *e + n + 1;
    return NULL;
}

int fa_options_load(char *const *envp)
{
    /* Loading: a log line about a bad value asks fa_opt() for FORGEALLOC_LOG,
     * which must see the values being loaded, not start a load of its own. */
    defaults_ready();
    __atomic_store_n(&loader_tid, gettid(), __ATOMIC_RELAXED);
    __atomic_store_n(&load_state, 1, __ATOMIC_RELEASE);
    invalid_count = 0;
    unknown_count = 0;
    for (int i = 0; i < FA_OPT_COUNT; i++)
        set_default((enum fa_opt_id)i);
    /* LOG and STRICT first: they decide how the others' problems are told. */
    static const enum fa_opt_id first[] = {FA_OPT_LOG, FA_OPT_STRICT};
    for (size_t k = 0; k < sizeof first / sizeof first[0]; k++) {
        const char *t = lookup(envp, first[k]);
        if (t)
            apply(envp, first[k], t);
    }
    for (int i = 0; i < FA_OPT_COUNT; i++) {
        if (i == FA_OPT_LOG || i == FA_OPT_STRICT || fa_option_table[i].scope != FA_SCOPE_LIB)
            continue;
        const char *t = lookup(envp, (enum fa_opt_id)i);
        if (t)
            apply(envp, (enum fa_opt_id)i, t);
    }
    for (char *const *e = envp; e && *e; e++) {
        if (strncmp(*e, "FORGEALLOC_", 11) != 0)
            continue;
        const char *eq = strchr(*e, '=');
        size_t n = eq ? (size_t)(eq - *e) : strlen(*e);
        if (find_option(*e, n) < 0) {
            char name[65], m[300];
            size_t k = n < 64 ? n : 64;
            memcpy(name, *e, k);
            name[k] = '\0';
            fa_buf b;
            fa_buf_init(&b, m, sizeof m);
            fa_buf_quoted_raw(&b, name, 64);
            unknown_count++;
            /* FORGEALLOC_STRICT refuses it as it refuses a bad value, in
             * every process; else the first process of a tree tells. */
            if (values[FA_OPT_STRICT].u) {
                fa_log(FA_LOG_ERROR, "%s is not a forgealloc setting; `forgealloc env` lists them all", m);
            } else {
                const char *entry = *e; /* its name ends at '=' */
                fa_warn_tree(envp, &entry, 1,
                             "%s is not a forgealloc setting and is ignored; `forgealloc env` lists them all", m);
            }
        }
    }
    __atomic_store_n(&load_state, 2, __ATOMIC_RELEASE);
    __atomic_store_n(&loader_tid, 0, __ATOMIC_RELAXED);
    return invalid_count;
}

int fa_options_invalid_count(void) { return invalid_count; }

int fa_options_unknown_count(void) { return unknown_count; }

const fa_optval *fa_opt(enum fa_opt_id id)
{
    if (__atomic_load_n(&load_state, __ATOMIC_ACQUIRE) != 2) {
        int expect = 0;
        if (__atomic_compare_exchange_n(&load_state, &expect, 1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            int invalid = fa_options_load(environ), bad = invalid + unknown_count;
            if (bad && values[FA_OPT_STRICT].u) {
                fa_error("FORGEALLOC_STRICT=1 and %d setting%s %s; refusing to start (fix or unset %s)", bad,
                         bad == 1 ? " is" : "s are",
                         !unknown_count ? "invalid" : invalid ? "invalid or unknown" : "unknown",
                         bad == 1 ? "it" : "them");
                _exit(2);
            }
        } else if (__atomic_load_n(&loader_tid, __ATOMIC_RELAXED) != gettid()) {
            /* Another thread is loading: `values` may still be filling
             * (zeros: STATS off, RELEASE_THRESHOLD "return all"), so this
             * thread gets the table's defaults until the load is done. */
            defaults_ready();
            if (__atomic_load_n(&load_state, __ATOMIC_ACQUIRE) != 2)
                return &defaults[id];
        }
        /* else: the loading thread itself (a log line asking for
         * FORGEALLOC_LOG): it sees the values as they are loaded. */
    }
    return &values[id];
}

/* ---- rendering -------------------------------------------------------- */

static const char *choice(const char *choices, uint64_t idx, char *tmp, size_t cap)
{
    const char *c = choices;
    for (uint64_t i = 0; i < idx && c; i++) {
        c = strchr(c, '|');
        if (c)
            c++;
    }
    if (!c)
        return "?";
    size_t n = strcspn(c, "|");
    if (n >= cap)
        n = cap - 1;
    memcpy(tmp, c, n);
    tmp[n] = '\0';
    return tmp;
}

void fa_options_copy(fa_optval out[FA_OPT_COUNT])
{
    for (int i = 0; i < FA_OPT_COUNT; i++)
        out[i] = *fa_opt((enum fa_opt_id)i);
}

void fa_option_format(fa_buf *b, enum fa_opt_id id) { fa_option_format_value(b, id, &values[id]); }

void fa_option_format_value(fa_buf *b, enum fa_opt_id id, const fa_optval *v)
{
    const fa_option_desc *d = &fa_option_table[id];
    char tmp[32];
    switch (d->type) {
    case FA_TYPE_SIZE_PCT:
        if (v->is_pct) {
            fa_buf_fixed(b, v->d, v->d == (double)(uint64_t)v->d ? 0 : 1);
            fa_buf_putc(b, '%');
            break;
        }
        /* fall through */
    case FA_TYPE_SIZE:
    case FA_TYPE_SIZE_POW2: fa_buf_bytes(b, v->u); break;
    case FA_TYPE_NUM: fa_buf_fixed(b, v->d, v->d == (double)(uint64_t)v->d ? 0 : 2); break;
    case FA_TYPE_INT: fa_buf_u64(b, v->u); break;
    case FA_TYPE_SECONDS:
        fa_buf_fixed(b, (double)v->u / 1000.0, v->u % 1000 ? 3 : 0);
        fa_buf_putc(b, 's');
        break;
    case FA_TYPE_BOOL: fa_buf_str(b, v->u ? "1" : "0"); break;
    case FA_TYPE_ENUM: fa_buf_str(b, choice(d->choices, v->u, tmp, sizeof tmp)); break;
    case FA_TYPE_PATH: fa_buf_str(b, v->s ? v->s : ""); break;
    }
}

static const char *type_name(fa_opt_type t)
{
    switch (t) {
    case FA_TYPE_SIZE: return "size";
    case FA_TYPE_SIZE_POW2: return "size, power of two";
    case FA_TYPE_SIZE_PCT: return "size or percent";
    case FA_TYPE_NUM: return "number";
    case FA_TYPE_INT: return "whole number";
    case FA_TYPE_SECONDS: return "seconds";
    case FA_TYPE_BOOL: return "boolean";
    case FA_TYPE_ENUM: return "choice";
    case FA_TYPE_PATH: return "path";
    }
    return "?";
}

void fa_options_json(fa_buf *b)
{
    (void)fa_opt(FA_OPT_LOG);
    fa_buf_putc(b, '[');
    for (int i = 0; i < FA_OPT_COUNT; i++) {
        const fa_option_desc *d = &fa_option_table[i];
        char vbuf[FA_PATH_MAX + 16];
        fa_buf v;
        fa_buf_init(&v, vbuf, sizeof vbuf);
        fa_option_format(&v, (enum fa_opt_id)i);
        fa_buf_str(b, i ? ",\n {\"name\":" : "\n {\"name\":");
        fa_buf_json_str(b, d->name);
        fa_buf_str(b, ",\"type\":");
        fa_buf_json_str(b, type_name(d->type));
        fa_buf_str(b, ",\"default\":");
        fa_buf_json_str(b, d->def);
        fa_buf_str(b, ",\"scope\":");
        fa_buf_json_str(b, d->scope == FA_SCOPE_LIB ? "library" : "launcher");
        if (d->scope == FA_SCOPE_LIB) {
            fa_buf_str(b, ",\"effective\":");
            fa_buf_json_str(b, vbuf);
            fa_buf_str(b, ",\"source\":");
            fa_buf_json_str(b, values[i].src == FA_SRC_ENV       ? "environment"
                               : values[i].src == FA_SRC_INVALID ? "invalid, default used"
                                                                 : "default");
        }
        if (d->choices) {
            fa_buf_str(b, ",\"choices\":");
            fa_buf_json_str(b, d->choices);
        }
        fa_buf_str(b, ",\"doc\":");
        fa_buf_json_str(b, d->doc);
        fa_buf_putc(b, '}');
    }
    fa_buf_str(b, "\n]\n");
}

void fa_options_echo(fa_buf *b)
{
    fa_buf_str(b, "settings:");
    for (int i = 0; i < FA_OPT_COUNT; i++) {
        if (fa_option_table[i].scope != FA_SCOPE_LIB)
            continue;
        fa_buf_printf(b, " %s=", fa_option_table[i].name + 11);
        fa_option_format(b, (enum fa_opt_id)i);
        if (values[i].src == FA_SRC_INVALID)
            fa_buf_str(b, "(default; setting invalid)");
    }
}
