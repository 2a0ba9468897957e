/* fuzz_render.c - libFuzzer harness for the stats renderers
 * (src/stats/render.c) over a snapshot built from the input.
 *
 * Input, read field by field (support.h; missing fields read as zero):
 * 2 bytes of output capacity (below 0x8000: that many bytes, else a buffer
 * large enough for anything), a flag byte (forked, in_signal, tc_valid,
 * cuda_seen, device_blind, blind_reason set), the reason, the number of
 * devices (0..FA_MAX_DEVICES), pid, ppid, the raw bits of release_rate, the
 * exe and blind_reason strings (any bytes: quotes, backslashes, control
 * characters, invalid UTF-8), then every counter, tcmalloc value and
 * per-device field; what is left is an environment block for
 * fa_options_load, whose values the snapshot then carries: the JSON
 * "config" object shows them (a path with any bytes in
 * FORGEALLOC_STATS_FILE, a percentage...).
 *
 * Checks, for text, JSON and Prometheus: the rendering into the small
 * buffer keeps the fa_buf contract (support.h) against the complete one,
 * which has no NUL byte inside; the complete JSON is valid JSON; the
 * complete Prometheus text passes prom_valid() below.  FA_STATS_OFF
 * renders nothing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/stats/render.h"
#include "support.h"

static char full_store[256 * 1024];
static fa_snapshot snap;
static char blind_reason[256];

/* ---- Prometheus text format (exposition format 0.0.4) ----------------- */

static bool is_name_char(char c, bool first, bool colon)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':') ||
           (!first && c >= '0' && c <= '9');
}

/* A metric name (colons allowed) or a label name; returns its length. */
static size_t prom_name(const char *p, const char *end, bool colon)
{
    size_t n = 0;
    while (p + n < end && is_name_char(p[n], n == 0, colon))
        n++;
    return n;
}

/* A sample value: a decimal float, +Inf, -Inf or NaN, up to `end`. */
static bool prom_number(const char *p, const char *end)
{
    size_t n = (size_t)(end - p);
    if ((n == 4 && (memcmp(p, "+Inf", 4) == 0 || memcmp(p, "-Inf", 4) == 0)) || (n == 3 && memcmp(p, "NaN", 3) == 0))
        return true;
    if (p < end && (*p == '+' || *p == '-'))
        p++;
    const char *d = p;
    while (p < end && *p >= '0' && *p <= '9')
        p++;
    if (p == d)
        return false;
    if (p < end && *p == '.') {
        d = ++p;
        while (p < end && *p >= '0' && *p <= '9')
            p++;
        if (p == d)
            return false;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        d = p;
        while (p < end && *p >= '0' && *p <= '9')
            p++;
        if (p == d)
            return false;
    }
    return p == end;
}

#define PROM_MAX_FAMILIES 256

typedef struct prom_state {
    char families[PROM_MAX_FAMILIES][96]; /* every TYPE'd name, in order */
    char types[PROM_MAX_FAMILIES][16];
    int nfamilies;
    char help[96]; /* name of the HELP line just seen, "" if none */
} prom_state;

static bool prom_comment(prom_state *st, const char *p, const char *end)
{
    bool is_help = (size_t)(end - p) > 7 && memcmp(p, "# HELP ", 7) == 0;
    bool is_type = (size_t)(end - p) > 7 && memcmp(p, "# TYPE ", 7) == 0;
    if (!is_help && !is_type)
        return false;
    p += 7;
    size_t n = prom_name(p, end, true);
    if (n == 0 || n >= sizeof st->help || p + n >= end || p[n] != ' ')
        return false;
    const char *text = p + n + 1;
    if (is_help) {
        for (const char *c = text; c < end; c++)
            if (*c == '\\' && (++c == end || (*c != '\\' && *c != 'n')))
                return false;
        memcpy(st->help, p, n);
        st->help[n] = '\0';
        return true;
    }
    /* TYPE: right after the HELP of the same name, once per name. */
    if (strlen(st->help) != n || memcmp(st->help, p, n) != 0 || st->nfamilies == PROM_MAX_FAMILIES)
        return false;
    st->help[0] = '\0';
    for (int i = 0; i < st->nfamilies; i++)
        if (strlen(st->families[i]) == n && memcmp(st->families[i], p, n) == 0)
            return false;
    static const char *const types[] = {"counter", "gauge", "histogram", "summary", "untyped"};
    size_t tn = (size_t)(end - text);
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        if (strlen(types[i]) == tn && memcmp(types[i], text, tn) == 0) {
            memcpy(st->families[st->nfamilies], p, n);
            st->families[st->nfamilies][n] = '\0';
            strcpy(st->types[st->nfamilies], types[i]);
            st->nfamilies++;
            return true;
        }
    }
    return false;
}

/* name{label="value",...} value, where the name belongs to the family of
 * the last TYPE line (for a histogram: _bucket with an le label, _sum,
 * _count). */
static bool prom_sample(prom_state *st, const char *p, const char *end)
{
    if (st->nfamilies == 0 || st->help[0])
        return false;
    const char *fam = st->families[st->nfamilies - 1];
    bool histogram = strcmp(st->types[st->nfamilies - 1], "histogram") == 0;
    size_t n = prom_name(p, end, true), fn = strlen(fam);
    if (n < fn || memcmp(p, fam, fn) != 0)
        return false;
    const char *suffix = p + fn;
    size_t sn = n - fn;
    bool bucket = histogram && sn == 7 && memcmp(suffix, "_bucket", 7) == 0;
    if (sn && !bucket && !(histogram && ((sn == 4 && memcmp(suffix, "_sum", 4) == 0) ||
                                         (sn == 6 && memcmp(suffix, "_count", 6) == 0))))
        return false;
    if (histogram && sn == 0)
        return false;
    p += n;
    bool has_le = false;
    char labels[8][32];
    int nlabels = 0;
    if (p < end && *p == '{') {
        p++;
        while (p < end && *p != '}') {
            if (nlabels && *p++ != ',')
                return false;
            size_t ln = prom_name(p, end, false);
            if (ln == 0 || ln >= sizeof labels[0] || nlabels == 8)
                return false;
            for (int i = 0; i < nlabels; i++)
                if (strlen(labels[i]) == ln && memcmp(labels[i], p, ln) == 0)
                    return false; /* a label twice */
            memcpy(labels[nlabels], p, ln);
            labels[nlabels++][ln] = '\0';
            has_le |= ln == 2 && memcmp(p, "le", 2) == 0;
            p += ln;
            if (end - p < 2 || p[0] != '=' || p[1] != '"')
                return false;
            for (p += 2; p < end && *p != '"'; p++)
                if (*p == '\\' && (++p == end || (*p != '\\' && *p != '"' && *p != 'n')))
                    return false;
            if (p == end)
                return false;
            p++; /* closing quote */
        }
        if (p == end)
            return false;
        p++; /* '}' */
    }
    if (bucket && !has_le)
        return false;
    if (p == end || *p != ' ')
        return false;
    return prom_number(p + 1, end);
}

static bool prom_valid(const char *s, size_t len)
{
    static prom_state st;
    memset(&st, 0, sizeof st);
    if (!fz_utf8_valid(s, len) || (len && s[len - 1] != '\n'))
        return false;
    for (const char *p = s, *end; p < s + len; p = end + 1) {
        end = memchr(p, '\n', (size_t)(s + len - p));
        if (!(*p == '#' ? prom_comment(&st, p, end) : prom_sample(&st, p, end)))
            return false;
    }
    return true;
}

/* ---- the snapshot ----------------------------------------------------- */

static void fill_snapshot(fz_reader *r)
{
    static const char *const reasons[] = {NULL, "exit", "signal", "interval", "request"};
    memset(&snap, 0, sizeof snap);
    uint8_t flags = fz_u8(r);
    snap.forked = flags & 1;
    snap.in_signal = flags & 2;
    snap.tc_valid = flags & 4;
    snap.cuda_seen = flags & 8;
    snap.device_blind = flags & 16;
    snap.reason = reasons[fz_u8(r) % 5];
    snap.ndevices = fz_u8(r) % (FA_MAX_DEVICES + 1);
    snap.pid = (int)fz_u32(r);
    snap.ppid = (int)fz_u32(r);
    uint64_t bits = fz_u64(r);
    memcpy(&snap.release_rate, &bits, sizeof bits);
    fz_str(r, snap.exe, sizeof snap.exe - 1);
    fz_str(r, blind_reason, sizeof blind_reason - 1);
    snap.blind_reason = flags & 32 ? blind_reason : NULL;
    snap.time_unix_ms = fz_num(r);
    snap.uptime_ms = fz_num(r);
    for (int i = 0; i < FA_CALL_COUNT; i++)
        snap.host.calls[i] = fz_num(r);
    snap.host.bytes_requested = fz_num(r);
    snap.host.large_allocs = fz_num(r);
    for (int i = 0; i < FA_HIST_BUCKETS; i++)
        snap.host.hist[i] = fz_num(r);
    snap.rss_bytes = fz_num(r);
    snap.peak_rss_bytes = fz_num(r);
    snap.releases = fz_num(r);
    snap.released_bytes = fz_num(r);
    snap.tc_age_ms = fz_num(r);
    for (int i = 0; i < FA_TC_COUNT; i++)
        snap.tc[i] = fz_num(r);
    snap.stat_records = fz_num(r);
    for (int i = 0; i < FA_PT_COUNT; i++)
        snap.passthrough[i] = fz_num(r);
    for (int d = 0; d < snap.ndevices; d++) {
        snap.dev[d].device = (int)fz_u32(r);
#define FA_DEV_READ(name, unit, doc) snap.dev[d].name = fz_num(r);
        FA_DEVICE_FIELDS(FA_DEV_READ)
#undef FA_DEV_READ
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_options_init();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_reader r = {data, size};
    size_t cap = fz_u8(&r) | (size_t)fz_u8(&r) << 8;
    if (cap >= 0x8000)
        cap = sizeof full_store;
    fill_snapshot(&r);
    fz_env env;
    fz_env_make(&env, r.p, r.n);
    fz_options_load_quietly(env.envp);
    fa_options_copy(snap.settings);

    char *small_store = malloc(cap);
    static const enum fa_stats_format formats[] = {FA_STATS_TEXT, FA_STATS_JSON, FA_STATS_PROMETHEUS, FA_STATS_OFF};
    for (size_t f = 0; f < sizeof formats / sizeof formats[0]; f++) {
        fa_buf small, full;
        fa_buf_init(&small, small_store, cap);
        fa_buf_init(&full, full_store, sizeof full_store);
        fa_render(&small, &snap, formats[f]);
        fa_render(&full, &snap, formats[f]);
        fz_check_truncation(&small, &full);
        FZ_CHECK(strlen(full.p) == full.len);
        if (formats[f] == FA_STATS_JSON)
            FZ_CHECK(fz_json_valid(full.p, full.len));
        if (formats[f] == FA_STATS_PROMETHEUS)
            FZ_CHECK(prom_valid(full.p, full.len));
        if (formats[f] == FA_STATS_OFF)
            FZ_CHECK(full.need == 0);
    }
    free(small_store);
    fz_env_free(&env);
    return 0;
}
