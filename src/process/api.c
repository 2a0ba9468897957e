/* api.c - the public functions of include/forgealloc.h. */
#include <errno.h>
#include <string.h>

#include "../host/host.h"
#include "../host/served.h"
#include "report.h"
#include "forgealloc.h"
#include "../core/options.h"

FA_API const char *forgealloc_version(void) { return FORGEALLOC_VERSION; }

FA_API size_t forgealloc_stats_json(char *buf, size_t len) { return fa_report_json(buf, len, "request"); }

FA_API int forgealloc_stats_write(int fd, const char *format)
{
    enum fa_stats_format fmt;
    if (format == NULL) {
        fmt = (enum fa_stats_format)fa_opt_u64(FA_OPT_STATS);
        if (fmt == FA_STATS_OFF)
            fmt = FA_STATS_TEXT;
    } else if (strcmp(format, "text") == 0) {
        fmt = FA_STATS_TEXT;
    } else if (strcmp(format, "json") == 0) {
        fmt = FA_STATS_JSON;
    } else if (strcmp(format, "prometheus") == 0) {
        fmt = FA_STATS_PROMETHEUS;
    } else {
        errno = EINVAL;
        return -1;
    }
    int err = fa_report_fd(fd, fmt, "request");
    if (err) {
        errno = err;
        return -1;
    }
    return 0;
}

/* Look `key` up in a snapshot: the JSON key paths of the stats document. */
static int lookup(const fa_snapshot *s, const char *key, uint64_t *v)
{
    if (strncmp(key, "host.calls.", 11) == 0) {
        for (int i = 0; i < FA_CALL_COUNT; i++)
            if (strcmp(key + 11, fa_call_names[i]) == 0)
                return *v = s->host.calls[i], 0;
        return -1;
    }
    if (strncmp(key, "host.tcmalloc.", 14) == 0) {
        for (int i = 0; i < FA_TC_COUNT && s->tc_valid; i++)
            if (strcmp(key + 14, fa_tc_keys[i]) == 0)
                return *v = s->tc[i], 0;
        return -1;
    }
    if (strncmp(key, "device.passthrough.", 19) == 0) {
        for (int i = 0; i < FA_PT_COUNT; i++)
            if (strcmp(key + 19, fa_pt_names[i]) == 0)
                return *v = s->passthrough[i], 0;
        return -1;
    }
    if (strncmp(key, "device.", 7) == 0 && key[7] >= '0' && key[7] <= '9') {
        /* The index is checked against ndevices digit by digit, so no
         * number of digits can overflow it. */
        const char *c = key + 7;
        int idx = 0;
        while (*c >= '0' && *c <= '9') {
            idx = idx * 10 + (*c++ - '0');
            if (idx >= s->ndevices)
                return -1;
        }
        if (*c++ != '.')
            return -1;
        const fa_device_stats *d = &s->dev[idx];
        if (strcmp(c, "device") == 0)
            return *v = (uint64_t)d->device, 0;
#define FA_DEV_LOOKUP(name, unit, doc) \
    if (strcmp(c, #name) == 0)         \
        return *v = d->name, 0;
        FA_DEVICE_FIELDS(FA_DEV_LOOKUP)
#undef FA_DEV_LOOKUP
        return -1;
    }
    if (strncmp(key, "host.", 5) == 0) {
#define FA_HOST_LOOKUP(hkey, kind, metric, shown, value, doc) \
    if (strcmp(key + 5, hkey) == 0)                          \
        return (shown) ? (*v = (uint64_t)(value), 0) : -1;
        FA_HOST_FIELDS(FA_HOST_LOOKUP)
#undef FA_HOST_LOOKUP
    }
    /* The numbers outside the tables. */
    const struct {
        const char *key;
        uint64_t value;
    } plain[] = {
        {"pid", (uint64_t)s->pid},
        {"host.interposed", s->malloc_server == FA_SERVER_SELF},
        {"device.devices", (uint64_t)s->ndevices},
    };
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++)
        if (strcmp(key, plain[i].key) == 0)
            return *v = plain[i].value, 0;
    return -1;
}

FA_API int forgealloc_stat(const char *key, uint64_t *value)
{
    fa_snapshot s;
    if (!key || !value)
        return -1;
    fa_snapshot_take(&s, "request", false);
    return lookup(&s, key, value);
}

FA_API const char *forgealloc_malloc_served_by(void) { return fa_host_served_by(); }

FA_API size_t forgealloc_release(void) { return fa_host_release_all(); }

FA_API size_t forgealloc_options_json(char *buf, size_t len)
{
    fa_buf b;
    fa_buf_init(&b, buf, len);
    fa_options_json(&b);
    return b.need;
}
