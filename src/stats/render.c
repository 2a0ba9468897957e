/* render.c - text, JSON and Prometheus renderings of one snapshot. */
#include "render.h"

#include <math.h>
#include <string.h>

#include "forgealloc.h"

const char *const fa_tc_keys[FA_TC_COUNT] = {
#define FA_TC_KEY(key, prop) #key,
    FA_TCMALLOC_PROPS(FA_TC_KEY)
#undef FA_TC_KEY
};
const char *const fa_tc_props[FA_TC_COUNT] = {
#define FA_TC_PROP(key, prop) prop,
    FA_TCMALLOC_PROPS(FA_TC_PROP)
#undef FA_TC_PROP
};
const char *const fa_pt_names[FA_PT_COUNT] = {
#define FA_PT_NAME(name) #name,
    FA_CUDA_PASSTHROUGH(FA_PT_NAME)
#undef FA_PT_NAME
};

/* Smallest size counted in histogram bucket i (see fa_hist_bucket). */
static uint64_t bucket_min(int i) { return i == 0 ? 0 : (uint64_t)1 << (i - 1); }
static uint64_t bucket_max(int i)
{
    return i == 0 ? 0 : i == FA_HIST_BUCKETS - 1 ? UINT64_MAX : ((uint64_t)1 << i) - 1;
}

/* The release rate read back from tcmalloc: anything but a plain number
 * (a program may set any double through tcmalloc's API) reads as unknown. */
static bool rate_known(double r) { return isfinite(r) && r >= 0 && r < 1e15; }

/* "FORGEALLOC_STATS_FILE" -> "stats_file" */
static void option_key(fa_buf *b, const char *name)
{
    for (const char *c = name + strlen("FORGEALLOC_"); *c; c++)
        fa_buf_putc(b, *c >= 'A' && *c <= 'Z' ? (char)(*c + 32) : *c);
}

/* ---- JSON ------------------------------------------------------------- */

static void json_key(fa_buf *b, const char *k, bool *first)
{
    if (!*first)
        fa_buf_putc(b, ',');
    *first = false;
    fa_buf_json_str(b, k);
    fa_buf_putc(b, ':');
}

static void json_u64(fa_buf *b, const char *k, uint64_t v, bool *first)
{
    json_key(b, k, first);
    fa_buf_u64(b, v);
}

static void json_config(fa_buf *b, const fa_snapshot *s)
{
    bool first = true;
    fa_buf_putc(b, '{');
    for (int i = 0; i < FA_OPT_COUNT; i++) {
        const fa_option_desc *d = &fa_option_table[i];
        if (d->scope != FA_SCOPE_LIB)
            continue;
        const fa_optval *v = &s->settings[i];
        char kbuf[64];
        fa_buf k;
        fa_buf_init(&k, kbuf, sizeof kbuf);
        option_key(&k, d->name);
        json_key(b, kbuf, &first);
        if (i == FA_OPT_RELEASE_RATE) { /* read back from tcmalloc itself */
            if (rate_known(s->release_rate))
                fa_buf_fixed(b, s->release_rate, 3);
            else
                fa_buf_str(b, "null");
            continue;
        }
        /* Formatted choices and percentages are short; a path (up to 4 KiB)
         * is written from the value itself.  No large buffer: this runs in
         * signal handlers. */
        char tbuf[64];
        fa_buf t;
        fa_buf_init(&t, tbuf, sizeof tbuf);
        switch (d->type) {
        case FA_TYPE_SIZE:
        case FA_TYPE_SIZE_POW2: fa_buf_u64(b, v->u); break;
        case FA_TYPE_SIZE_PCT:
            if (v->is_pct) {
                fa_option_format_value(&t, (enum fa_opt_id)i, v);
                fa_buf_json_str(b, tbuf);
            } else {
                fa_buf_u64(b, v->u);
            }
            break;
        case FA_TYPE_NUM: fa_buf_fixed(b, v->d, 3); break;
        case FA_TYPE_INT: fa_buf_u64(b, v->u); break;
        case FA_TYPE_SECONDS: fa_buf_fixed(b, (double)v->u / 1000.0, 3); break;
        case FA_TYPE_BOOL: fa_buf_str(b, v->u ? "true" : "false"); break;
        case FA_TYPE_ENUM:
            fa_option_format_value(&t, (enum fa_opt_id)i, v);
            fa_buf_json_str(b, tbuf);
            break;
        case FA_TYPE_PATH: fa_buf_json_str(b, v->s ? v->s : ""); break;
        }
    }
    fa_buf_putc(b, '}');
}

/* The FA_HOST_FIELDS rows of the "host" object, each under the object its
 * key's dot names (opened at its first row, closed after its last). */
typedef struct json_nest {
    bool *first;       /* the host object's */
    const char *group; /* the key of the object open now, NULL if none */
    size_t glen;
    bool gfirst;       /* the open object's */
} json_nest;

static void json_host_row(fa_buf *b, json_nest *n, const char *key, enum fa_field_kind kind, uint64_t v)
{
    const char *dot = strchr(key, '.');
    size_t glen = dot ? (size_t)(dot - key) : 0;
    if (n->group && (glen != n->glen || memcmp(key, n->group, glen) != 0)) {
        fa_buf_putc(b, '}');
        n->group = NULL;
    }
    if (dot && !n->group) {
        if (!*n->first)
            fa_buf_putc(b, ',');
        *n->first = false;
        fa_buf_putc(b, '"');
        fa_buf_mem(b, key, glen);
        fa_buf_str(b, "\":{");
        n->group = key;
        n->glen = glen;
        n->gfirst = true;
    }
    json_key(b, dot ? dot + 1 : key, dot ? &n->gfirst : n->first);
    if (kind == FA_FLAG)
        fa_buf_str(b, v ? "true" : "false");
    else
        fa_buf_u64(b, v);
}

static void json_host_fields(fa_buf *b, const fa_snapshot *s, bool *first)
{
    json_nest n = {.first = first};
#define FA_HOST_JSON(key, kind, metric, shown, value, doc) \
    if (shown)                                             \
        json_host_row(b, &n, key, kind, (uint64_t)(value));
    FA_HOST_FIELDS(FA_HOST_JSON)
#undef FA_HOST_JSON
    if (n.group)
        fa_buf_putc(b, '}');
}

static void json_device(fa_buf *b, const fa_device_stats *d)
{
    bool first = true;
    fa_buf_putc(b, '{');
    json_key(b, "device", &first);
    fa_buf_i64(b, d->device);
    json_key(b, "pool_type", &first); /* which pool serves: physical pieces, chunks, or none (pass-through) */
    fa_buf_json_str(b, d->vmm ? "pieces" : d->pool_chunks || d->chunks_returned ? "chunks" : "none");
#define FA_DEV_JSON(name, unit, doc) json_u64(b, #name, d->name, &first);
    FA_DEVICE_FIELDS(FA_DEV_JSON)
#undef FA_DEV_JSON
    fa_buf_putc(b, '}');
}

void fa_render_json(fa_buf *b, const fa_snapshot *s)
{
    bool first = true;
    fa_buf_putc(b, '{');
    json_key(b, "schema", &first);
    fa_buf_json_str(b, FA_STATS_SCHEMA);
    json_key(b, "version", &first);
    fa_buf_json_str(b, FORGEALLOC_VERSION);
    json_key(b, "reason", &first);
    fa_buf_json_str(b, s->reason ? s->reason : "request");
    json_u64(b, "pid", (uint64_t)s->pid, &first);
    json_u64(b, "ppid", (uint64_t)s->ppid, &first);
    json_key(b, "forked", &first);
    fa_buf_str(b, s->forked ? "true" : "false");
    json_key(b, "exe", &first);
    fa_buf_json_str(b, s->exe);
    json_u64(b, "time_unix_ms", s->time_unix_ms, &first);
    json_u64(b, "uptime_ms", s->uptime_ms, &first);
    json_key(b, "config", &first);
    json_config(b, s);

    fa_buf_str(b, ",\n\"host\":{\"calls\":{");
    for (int i = 0; i < FA_CALL_COUNT; i++) {
        if (i)
            fa_buf_putc(b, ',');
        fa_buf_json_str(b, fa_call_names[i]);
        fa_buf_putc(b, ':');
        fa_buf_u64(b, s->host.calls[i]);
    }
    fa_buf_putc(b, '}');
    first = false;
    json_host_fields(b, s, &first);
    /* Who serves malloc: when it is not forgealloc, the calls above are
     * only those that reached it anyway. */
    json_key(b, "interposed", &first);
    fa_buf_str(b, s->malloc_server == FA_SERVER_SELF ? "true" : "false");
    json_key(b, "served_by", &first);
    if (s->served_by && s->served_by[0])
        fa_buf_json_str(b, s->served_by);
    else
        fa_buf_str(b, "null");
    json_key(b, "size_histogram", &first);
    fa_buf_putc(b, '[');
    bool hfirst = true;
    for (int i = 0; i < FA_HIST_BUCKETS; i++) {
        if (!s->host.hist[i])
            continue;
        if (!hfirst)
            fa_buf_putc(b, ',');
        hfirst = false;
        fa_buf_str(b, "{\"min\":");
        fa_buf_u64(b, bucket_min(i));
        fa_buf_str(b, ",\"max\":");
        fa_buf_u64(b, bucket_max(i));
        fa_buf_str(b, ",\"count\":");
        fa_buf_u64(b, s->host.hist[i]);
        fa_buf_putc(b, '}');
    }
    fa_buf_putc(b, ']');
    json_key(b, "tcmalloc", &first);
    fa_buf_putc(b, '{');
    bool tfirst = true;
    json_key(b, "valid", &tfirst);
    fa_buf_str(b, s->tc_valid ? "true" : "false");
    json_key(b, "serves_malloc", &tfirst);
    fa_buf_str(b, s->malloc_server == FA_SERVER_OTHER ? "false" : "true");
    json_u64(b, "age_ms", s->tc_age_ms, &tfirst);
    for (int i = 0; i < FA_TC_COUNT; i++) {
        json_key(b, fa_tc_keys[i], &tfirst);
        if (s->tc_valid)
            fa_buf_u64(b, s->tc[i]);
        else
            fa_buf_str(b, "null");
    }
    fa_buf_str(b, "}}");

    fa_buf_str(b, ",\n\"device\":{");
    first = true;
    json_key(b, "cuda_seen", &first);
    fa_buf_str(b, s->cuda_seen ? "true" : "false");
    json_key(b, "blind", &first);
    fa_buf_str(b, s->device_blind ? "true" : "false");
    json_key(b, "blind_reason", &first);
    if (s->blind_reason)
        fa_buf_json_str(b, s->blind_reason);
    else
        fa_buf_str(b, "null");
    json_key(b, "passthrough", &first);
    fa_buf_putc(b, '{');
    for (int i = 0; i < FA_PT_COUNT; i++) {
        if (i)
            fa_buf_putc(b, ',');
        fa_buf_json_str(b, fa_pt_names[i]);
        fa_buf_putc(b, ':');
        fa_buf_u64(b, s->passthrough[i]);
    }
    fa_buf_putc(b, '}');
    json_key(b, "devices", &first);
    fa_buf_putc(b, '[');
    for (int i = 0; i < s->ndevices; i++) {
        if (i)
            fa_buf_putc(b, ',');
        fa_buf_str(b, "\n ");
        json_device(b, &s->dev[i]);
    }
    fa_buf_str(b, "]}}\n");
}

/* ---- text ------------------------------------------------------------- */

void fa_render_text(fa_buf *b, const fa_snapshot *s)
{
    uint64_t allocs = 0;
    for (int i = 0; i < FA_CALL_COUNT; i++)
        if (i != FA_CALL_free && i != FA_CALL_delete)
            allocs += s->host.calls[i];
    /* exe and blind_reason come from outside: escaped so a newline or a
     * terminal escape in a path cannot reach the terminal. */
    fa_buf_printf(b, "forgealloc %s: pid %d (", FORGEALLOC_VERSION, s->pid);
    fa_buf_quoted_raw(b, s->exe, sizeof s->exe);
    fa_buf_printf(b, ")%s, %s after ", s->forked ? ", forked" : "", s->reason ? s->reason : "request");
    fa_buf_fixed(b, (double)s->uptime_ms / 1000.0, 3);
    fa_buf_str(b, " s\n");
    fa_buf_str(b, "  host calls:");
    for (int i = 0; i < FA_CALL_COUNT; i++) {
        if (!s->host.calls[i])
            continue;
        fa_buf_printf(b, " %s ", fa_call_names[i]);
        fa_buf_grouped(b, s->host.calls[i]);
    }
    if (!allocs && !s->host.calls[FA_CALL_free] && !s->host.calls[FA_CALL_delete])
        fa_buf_str(b, " none");
    if (s->malloc_server != FA_SERVER_SELF) {
        fa_buf_str(b, "\n  malloc served by ");
        fa_buf_quoted_raw(b, s->served_by && s->served_by[0] ? s->served_by : "another library", 300);
        fa_buf_str(b, s->malloc_server == FA_SERVER_SAME_TCMALLOC
                          ? " ahead of forgealloc: its calls are not counted; the tcmalloc numbers are the process's"
                          : " ahead of forgealloc: its calls are not counted and its heap is not shown");
    }
    fa_buf_str(b, "\n  requested: ");
    fa_buf_bytes(b, s->host.bytes_requested);
    fa_buf_str(b, " in ");
    fa_buf_grouped(b, allocs);
    fa_buf_str(b, " allocations");
    if (s->host.large_allocs) {
        fa_buf_str(b, ", ");
        fa_buf_grouped(b, s->host.large_allocs);
        fa_buf_str(b, " at or above ");
        fa_buf_bytes(b, s->settings[FA_OPT_LARGE_ALLOC_REPORT].u);
    }
    fa_buf_str(b, "\n  memory: rss ");
    fa_buf_bytes(b, s->rss_bytes);
    fa_buf_str(b, " (peak ");
    fa_buf_bytes(b, s->peak_rss_bytes);
    fa_buf_str(b, ")");
    if (s->tc_valid) {
        fa_buf_str(b, "; tcmalloc: in use ");
        fa_buf_bytes(b, s->tc[FA_TC_current_allocated_bytes]);
        fa_buf_str(b, ", heap ");
        fa_buf_bytes(b, s->tc[FA_TC_heap_size]);
        fa_buf_str(b, ", free ");
        fa_buf_bytes(b, s->tc[FA_TC_pageheap_free_bytes]);
        fa_buf_str(b, ", returned to the OS ");
        fa_buf_bytes(b, s->tc[FA_TC_pageheap_unmapped_bytes]);
        if (s->tc_age_ms)
            fa_buf_printf(b, " (as of %llu ms earlier)", (unsigned long long)s->tc_age_ms);
    }
    fa_buf_str(b, "\n  released by forgealloc: ");
    fa_buf_bytes(b, s->released_bytes);
    fa_buf_str(b, " in ");
    fa_buf_grouped(b, s->releases);
    fa_buf_str(b, " returns (");
    const char *sep = "";
#define FA_REL_TEXT(name, doc, arg)                           \
    if (s->released_by[FA_REL_##name]) {                     \
        fa_buf_printf(b, "%s%s ", sep, #name);               \
        fa_buf_bytes(b, s->released_by[FA_REL_##name]);      \
        sep = ", ";                                          \
    }
    FA_RELEASE_REASONS(FA_REL_TEXT, )
#undef FA_REL_TEXT
    fa_buf_printf(b, "%skeeps ", sep);
    fa_buf_bytes(b, s->settings[FA_OPT_RELEASE_THRESHOLD].u);
    if (s->release_hold_ms) {
        fa_buf_str(b, ", returns what stays free for ");
        fa_buf_fixed(b, (double)s->release_hold_ms / 1000.0, 1);
        fa_buf_str(b, " s");
    }
    fa_buf_str(b, "); release rate ");
    if (rate_known(s->release_rate))
        fa_buf_fixed(b, s->release_rate, s->release_rate == floor(s->release_rate) ? 0 : 2);
    else
        fa_buf_str(b, "unknown");
    fa_buf_putc(b, '\n');
    /* Blind comes first: under those settings PyTorch may make no call
     * the shim sees at all. */
    if (s->device_blind) {
        fa_buf_str(b, "  device: pool off (");
        fa_buf_quoted_raw(b, s->blind_reason ? s->blind_reason : "blind", 200);
        fa_buf_str(b, ")\n");
    }
    if (!s->cuda_seen) {
        fa_buf_str(b, "  device: no CUDA calls\n");
        return;
    }
    for (int i = 0; i < s->ndevices; i++) {
        const fa_device_stats *d = &s->dev[i];
        fa_buf_printf(b, "  device %d: pool ", d->device);
        fa_buf_bytes(b, d->pool_bytes);
        if (d->vmm) {
            fa_buf_str(b, " in ");
            fa_buf_grouped(b, d->pieces_mapped);
            fa_buf_str(b, " pieces (idle ");
            fa_buf_bytes(b, d->idle_bytes);
            fa_buf_str(b, ")");
        } else if (d->pool_chunks) {
            fa_buf_str(b, " in ");
            fa_buf_grouped(b, d->pool_chunks);
            fa_buf_str(b, " chunks (idle ");
            fa_buf_bytes(b, d->idle_bytes);
            fa_buf_str(b, ")");
        }
        fa_buf_str(b, ", in use ");
        fa_buf_bytes(b, d->in_use_bytes);
        fa_buf_str(b, " (peak ");
        fa_buf_bytes(b, d->peak_in_use_bytes);
        fa_buf_str(b, "), waste ");
        fa_buf_bytes(b, d->waste_bytes);
        fa_buf_str(b, "\n    cudaMalloc ");
        fa_buf_grouped(b, d->allocs);
        fa_buf_str(b, " (pool ");
        fa_buf_grouped(b, d->pool_allocs);
        fa_buf_str(b, ", driver ");
        fa_buf_grouped(b, d->fallback_allocs);
        fa_buf_str(b, ", failed ");
        fa_buf_grouped(b, d->failed_allocs);
        fa_buf_str(b, "), cudaFree ");
        fa_buf_grouped(b, d->frees);
        fa_buf_str(b, "; driver calls: malloc ");
        fa_buf_grouped(b, d->driver_malloc_calls);
        fa_buf_str(b, ", free ");
        fa_buf_grouped(b, d->driver_free_calls);
        fa_buf_str(b, ", syncs ");
        fa_buf_grouped(b, d->device_syncs);
        fa_buf_str(b, ", ");
        fa_buf_fixed(b, (double)d->driver_ns / 1e6, 3);
        fa_buf_str(b, " ms\n");
    }
}

/* ---- Prometheus ------------------------------------------------------- */

static void prom_head(fa_buf *b, const char *name, const char *type, const char *help)
{
    fa_buf_printf(b, "# HELP forgealloc_%s %s\n# TYPE forgealloc_%s %s\n", name, help, name, type);
}

static void prom_value(fa_buf *b, const fa_snapshot *s, const char *name, const char *labels, uint64_t v)
{
    fa_buf_printf(b, "forgealloc_%s{pid=\"%d\"%s%s} ", name, s->pid, labels ? "," : "", labels ? labels : "");
    fa_buf_u64(b, v);
    fa_buf_putc(b, '\n');
}

static void prom_metric(fa_buf *b, const fa_snapshot *s, const char *name, const char *type, const char *help,
                        uint64_t v)
{
    prom_head(b, name, type, help);
    prom_value(b, s, name, NULL, v);
}

/* A FA_HOST_FIELDS row as forgealloc_host_<key>: the dot as an underscore,
 * _total after a counter's name. */
static void prom_host_metric(fa_buf *b, const fa_snapshot *s, const char *key, enum fa_field_kind kind,
                             const char *help, uint64_t v)
{
    char nbuf[80];
    fa_buf n;
    fa_buf_init(&n, nbuf, sizeof nbuf);
    fa_buf_str(&n, "host_");
    for (const char *c = key; *c; c++)
        fa_buf_putc(&n, *c == '.' ? '_' : *c);
    if (kind == FA_COUNTER)
        fa_buf_str(&n, "_total");
    prom_metric(b, s, nbuf, kind == FA_COUNTER ? "counter" : "gauge", help, v);
}

/* A label value from outside (a path): escape \\ and ", UTF-8 as itself,
 * controls and bytes that are not UTF-8 as '?'. */
static void prom_label_value(fa_buf *b, const char *v)
{
    for (const unsigned char *c = (const unsigned char *)v; *c; c++) {
        size_t n = *c >= 0x80 ? fa_utf8_len(c) : 0;
        if (n) {
            fa_buf_mem(b, (const char *)c, n);
            c += n - 1;
            continue;
        }
        if (*c == '\\' || *c == '"')
            fa_buf_putc(b, '\\');
        fa_buf_putc(b, *c < 0x20 || *c >= 0x7f ? '?' : (char)*c);
    }
}

void fa_render_prometheus(fa_buf *b, const fa_snapshot *s)
{
    char lbuf[160];
    fa_buf l;
    prom_head(b, "info", "gauge", "forgealloc version and process");
    fa_buf_printf(b, "forgealloc_info{pid=\"%d\",version=\"%s\",exe=\"", s->pid, FORGEALLOC_VERSION);
    prom_label_value(b, s->exe);
    fa_buf_str(b, "\"} 1\n");
    prom_head(b, "host_calls_total", "counter", "calls that entered the shim, per function");
    for (int i = 0; i < FA_CALL_COUNT; i++) {
        fa_buf_init(&l, lbuf, sizeof lbuf);
        fa_buf_printf(&l, "function=\"%s\"", fa_call_names[i]);
        prom_value(b, s, "host_calls_total", lbuf, s->host.calls[i]);
    }
    prom_head(b, "host_alloc_size_bytes", "histogram", "sizes requested by allocating calls");
    uint64_t cum = 0;
    for (int i = 0; i < FA_HIST_BUCKETS - 1; i++) {
        cum += s->host.hist[i];
        fa_buf_init(&l, lbuf, sizeof lbuf);
        fa_buf_printf(&l, "le=\"%llu\"", (unsigned long long)bucket_max(i));
        prom_value(b, s, "host_alloc_size_bytes_bucket", lbuf, cum);
    }
    cum += s->host.hist[FA_HIST_BUCKETS - 1];
    prom_value(b, s, "host_alloc_size_bytes_bucket", "le=\"+Inf\"", cum);
    prom_value(b, s, "host_alloc_size_bytes_sum", NULL, s->host.bytes_requested);
    prom_value(b, s, "host_alloc_size_bytes_count", NULL, cum);
    prom_head(b, "host_interposed", "gauge", "1 when forgealloc serves malloc, 0 when the library in served_by does");
    fa_buf_printf(b, "forgealloc_host_interposed{pid=\"%d\",served_by=\"", s->pid);
    prom_label_value(b, s->served_by ? s->served_by : "");
    fa_buf_printf(b, "\"} %d\n", s->malloc_server == FA_SERVER_SELF);
#define FA_HOST_PROM(key, kind, metric, shown, value, doc) \
    if (metric == FA_METRIC && (shown))                    \
        prom_host_metric(b, s, key, kind, doc, (uint64_t)(value));
    FA_HOST_FIELDS(FA_HOST_PROM)
#undef FA_HOST_PROM
    if (s->tc_valid) {
        for (int i = 0; i < FA_TC_COUNT; i++) {
            char nbuf[80];
            fa_buf n;
            fa_buf_init(&n, nbuf, sizeof nbuf);
            fa_buf_printf(&n, "tcmalloc_%s", fa_tc_keys[i]);
            fa_buf_init(&l, lbuf, sizeof lbuf);
            fa_buf_printf(&l, "tcmalloc property %s", fa_tc_props[i]);
            prom_metric(b, s, nbuf, "gauge", lbuf, s->tc[i]);
        }
    }
    prom_head(b, "device_passthrough_calls_total", "counter", "CUDA allocation calls counted and passed through");
    for (int i = 0; i < FA_PT_COUNT; i++) {
        fa_buf_init(&l, lbuf, sizeof lbuf);
        fa_buf_printf(&l, "function=\"%s\"", fa_pt_names[i]);
        prom_value(b, s, "device_passthrough_calls_total", lbuf, s->passthrough[i]);
    }
#define FA_DEV_PROM(name, unit, doc)                                                              \
    if (s->ndevices) {                                                                            \
        bool counter = strcmp(unit, "count") == 0 || strcmp(#name, "driver_ns") == 0;             \
        prom_head(b, counter ? "device_" #name "_total" : "device_" #name, counter ? "counter" : "gauge", doc); \
        for (int i = 0; i < s->ndevices; i++) {                                                   \
            fa_buf_init(&l, lbuf, sizeof lbuf);                                                   \
            fa_buf_printf(&l, "device=\"%d\"", s->dev[i].device);                                 \
            prom_value(b, s, counter ? "device_" #name "_total" : "device_" #name, lbuf, s->dev[i].name); \
        }                                                                                         \
    }
    FA_DEVICE_FIELDS(FA_DEV_PROM)
#undef FA_DEV_PROM
}

void fa_render(fa_buf *b, const fa_snapshot *s, enum fa_stats_format fmt)
{
    switch (fmt) {
    case FA_STATS_TEXT: fa_render_text(b, s); break;
    case FA_STATS_JSON: fa_render_json(b, s); break;
    case FA_STATS_PROMETHEUS: fa_render_prometheus(b, s); break;
    case FA_STATS_OFF: break;
    }
}
