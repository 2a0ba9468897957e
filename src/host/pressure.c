/* pressure.c - memory headroom from cgroups and /proc/meminfo (pressure.h). */
#define _GNU_SOURCE
#include "pressure.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../core/log.h"

#define DIR_MAX 1024

/* Where the process's cgroups and mounts are read from. */
static struct {
    const char *cgroup, *mountinfo;
} sources = {"/proc/self/cgroup", "/proc/self/mountinfo"};

/* The memory cgroup found at first use: 0 not looked, 1 found, 2 none. */
static int state;
static bool is_v1;
static size_t mount_len; /* the part of dir that is the mount point */
static char dir[DIR_MAX];
static int lock;

/* The files are read into these rather than onto the stack: the tick may
 * run on any thread of the program (one with a small stack) when no thread
 * of ours can.  One caller at a time, as for the limits below. */
static struct {
    char text[2048]; /* /proc/self/cgroup while searching; memory.stat, /proc/meminfo */
    char path[DIR_MAX + 40];
    char cand[DIR_MAX]; /* a mount's candidate directory */
} scratch;

static bool parse_u64(const char *s, uint64_t *out)
{
    uint64_t v = 0;
    if (*s < '0' || *s > '9')
        return false;
    for (; *s >= '0' && *s <= '9'; s++) {
        if (v > (UINT64_MAX - 9) / 10)
            return false;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    *out = v;
    return true;
}

bool fa_pressure_parse_limit(const char *text, uint64_t *out)
{
    if (strncmp(text, "max", 3) == 0) {
        *out = UINT64_MAX;
        return true;
    }
    if (!parse_u64(text, out))
        return false;
    if (*out >= ((uint64_t)1 << 62)) /* v1 writes 9223372036854771712 for "none" */
        *out = UINT64_MAX;
    return true;
}

bool fa_pressure_parse_meminfo(const char *text, uint64_t *out)
{
    const char *p = strstr(text, "MemAvailable:");
    if (!p)
        return false;
    p += sizeof "MemAvailable:" - 1;
    while (*p == ' ')
        p++;
    uint64_t kb;
    if (!parse_u64(p, &kb))
        return false;
    *out = kb * 1024u;
    return true;
}

/* The n-th space-separated field of a line (0-based), its length in *len. */
static const char *field(const char *line, int n, size_t *len)
{
    const char *p = line;
    for (int i = 0; i < n; i++) {
        p = strchr(p, ' ');
        if (!p)
            return NULL;
        p++;
    }
    const char *e = p;
    while (*e && *e != ' ' && *e != '\n')
        e++;
    *len = (size_t)(e - p);
    return p;
}

/* The path of the cgroup line "ID:CONTROLLERS:PATH" whose controllers are
 * `want` ("" for the v2 line, "memory" among a v1 list). */
static const char *cgroup_path(const char *proc_cgroup, bool v1, size_t *len)
{
    for (const char *l = proc_cgroup; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        const char *c = strchr(l, ':');
        if (!c)
            return NULL;
        const char *c2 = strchr(c + 1, ':');
        const char *end = strchr(l, '\n');
        if (!c2 || (end && c2 > end))
            continue;
        bool match = false;
        if (!v1) {
            match = c2 == c + 1 && strncmp(l, "0:", 2) == 0;
        } else {
            for (const char *w = c + 1; w < c2;) {
                const char *comma = memchr(w, ',', (size_t)(c2 - w));
                const char *we = comma ? comma : c2;
                if (we - w == 6 && strncmp(w, "memory", 6) == 0)
                    match = true;
                w = we + 1;
            }
        }
        if (match) {
            const char *p = c2 + 1;
            *len = end ? (size_t)(end - p) : strlen(p);
            return p;
        }
    }
    return NULL;
}

/* A mountinfo field into out, its octal escapes (\040 for a blank, \011,
 * \012, \134) decoded; the length, or cap when it does not fit. */
static size_t unescape(const char *s, size_t len, char *out, size_t cap)
{
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (c == '\\' && i + 3 < len && s[i + 1] >= '0' && s[i + 1] <= '3' &&
            s[i + 2] >= '0' && s[i + 2] <= '7' && s[i + 3] >= '0' && s[i + 3] <= '7') {
            c = (char)((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0'));
            i += 3;
        }
        if (n + 1 >= cap)
            return cap;
        out[n++] = c;
    }
    out[n] = '\0';
    return n;
}

bool fa_pressure_cgroup_dir(const char *proc_cgroup, const char *line, char *out, size_t cap, bool *v1,
                            size_t *mlen)
{
    /* mountinfo: ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS */
    const char *sep = strstr(line, " - ");
    if (!sep)
        return false;
    size_t tlen = 0, rlen = 0, mplen = 0, olen = 0;
    const char *type = field(sep + 3, 0, &tlen);
    const char *super = field(sep + 3, 2, &olen);
    const char *root = field(line, 3, &rlen);
    const char *mp = field(line, 4, &mplen);
    if (!type || !root || !mp)
        return false;
    bool is2 = tlen == 7 && strncmp(type, "cgroup2", 7) == 0;
    bool is1 = tlen == 6 && strncmp(type, "cgroup", 6) == 0;
    if (is1) {
        bool mem = false;
        for (const char *w = super; w && w < super + olen;) {
            const char *comma = memchr(w, ',', (size_t)(super + olen - w));
            const char *we = comma ? comma : super + olen;
            if (we - w == 6 && strncmp(w, "memory", 6) == 0)
                mem = true;
            w = we + 1;
        }
        if (!mem)
            return false;
    } else if (!is2) {
        return false;
    }
    size_t plen;
    const char *path = cgroup_path(proc_cgroup, is1, &plen);
    if (!path)
        return false;
    /* The mount shows the hierarchy from ROOT down: strip it from PATH. */
    rlen = unescape(root, rlen, out, cap);
    if (rlen >= cap)
        return false;
    if (!(rlen == 1 && out[0] == '/')) {
        if (plen < rlen || strncmp(path, out, rlen) != 0 || (plen > rlen && path[rlen] != '/'))
            return false;
        path += rlen;
        plen -= rlen;
    }
    mplen = unescape(mp, mplen, out, cap);
    if (mplen >= cap || mplen + plen + 1 > cap)
        return false;
    memcpy(out + mplen, path, plen);
    out[mplen + plen] = '\0';
    while (mplen + plen > mplen && out[mplen + plen - 1] == '/')
        out[mplen + --plen] = '\0';
    *v1 = is1;
    *mlen = mplen;
    return true;
}

/* The length of the parent of the cgroup directory d[0, len) (a mount
 * point of mount_len bytes is the top). */
static size_t parent_len(const char *d, size_t len, size_t top)
{
    while (len > top && d[len - 1] != '/')
        len--;
    if (len > top)
        len--; /* drop the '/' */
    return len;
}

struct cgroup_search {
    const char *proc_cgroup; /* the text of /proc/self/cgroup */
};

/* One mountinfo line: a hierarchy holding our memory cgroup whose limit
 * file exists is taken; a v2 one ends the search. */
static bool try_mount(char *line, void *arg)
{
    const struct cgroup_search *c = arg;
    char *cand = scratch.cand, *probe = scratch.path, tmp[8];
    bool v1;
    size_t ml;
    if (!fa_pressure_cgroup_dir(c->proc_cgroup, line, cand, sizeof scratch.cand, &v1, &ml))
        return true;
    /* v1 puts the limit file in every cgroup of the memory hierarchy.  v2
     * only where the parent enables the controller: a leaf without it still
     * counts against its ancestors' limits.  No file at any level: the
     * memory controller is elsewhere (a v1 hierarchy beside this one). */
    size_t cl = strlen(cand), len = cl;
    for (;;) {
        memcpy(probe, cand, len);
        strcpy(probe + len, v1 ? "/memory.limit_in_bytes" : "/memory.max");
        if (fa_read_file(probe, tmp, sizeof tmp) > 0)
            break;
        if (v1 || len <= ml)
            return true;
        len = parent_len(cand, len, ml);
    }
    memcpy(dir, cand, cl + 1);
    is_v1 = v1;
    mount_len = ml;
    state = 1;
    return v1; /* keep looking for a v2 mount after a v1 one */
}

/* Find our memory cgroup: the v2 hierarchy wins over v1 when the memory
 * controller is enabled there (memory.max exists). */
static void find_cgroup(void)
{
    char *cg = scratch.text;
    struct cgroup_search c = {.proc_cgroup = cg};
    if (fa_read_file(sources.cgroup, cg, sizeof scratch.text) > 0)
        fa_read_lines(sources.mountinfo, try_mount, &c);
    if (state != 1)
        state = 2;
}

static void ensure_found(void)
{
    if (__atomic_load_n(&state, __ATOMIC_ACQUIRE))
        return;
    while (__atomic_exchange_n(&lock, 1, __ATOMIC_ACQUIRE))
        ;
    if (state == 0)
        find_cgroup();
    __atomic_store_n(&lock, 0, __ATOMIC_RELEASE);
}

static bool read_text(const char *d, size_t dl, const char *name, char *text, size_t cap)
{
    char *path = scratch.path;
    size_t nl = strlen(name);
    if (dl + 1 + nl + 1 > sizeof scratch.path)
        return false;
    memcpy(path, d, dl);
    path[dl] = '/';
    memcpy(path + dl + 1, name, nl + 1);
    return fa_read_file(path, text, cap) > 0;
}

static bool read_value(const char *d, size_t dl, const char *name, uint64_t *out)
{
    char text[64];
    return read_text(d, dl, name, text, sizeof text) && fa_pressure_parse_limit(text, out);
}

bool fa_pressure_parse_stat(const char *text, const char *key, uint64_t *out)
{
    size_t kl = strlen(key);
    for (const char *line = text; *line;) {
        if (strncmp(line, key, kl) == 0 && line[kl] == ' ')
            return parse_u64(line + kl + 1, out);
        const char *nl = strchr(line, '\n');
        if (!nl)
            break;
        line = nl + 1;
    }
    return false;
}

/* The usage that counts against a limit: what the cgroup is charged, less
 * the page cache the kernel can drop at once (inactive file pages), as
 * Docker and the kubelet count a container's working set.  A container
 * that read a model file is not short of memory for that. */
static bool read_usage(const char *d, size_t dl, uint64_t *out)
{
    if (!read_value(d, dl, is_v1 ? "memory.usage_in_bytes" : "memory.current", out))
        return false;
    char *stat = scratch.text; /* the key is within the first 1 KiB of either version's file */
    uint64_t inactive;
    if (read_text(d, dl, "memory.stat", stat, sizeof scratch.text) &&
        fa_pressure_parse_stat(stat, is_v1 ? "total_inactive_file" : "inactive_file", &inactive))
        *out = *out > inactive ? *out - inactive : 0;
    return true;
}

/* The limits of the cgroup and its ancestors down to the mount point (a
 * limit set on a parent, a container's own cgroup, binds as well), as last
 * read: they change only when somebody sets them (docker update), so they
 * are read again every LIMITS_MS, and on other calls only the usage of the
 * levels that have one: one file a call under a container's limit, none
 * without a limit.  One caller at a time (the release policy's tick). */
#define LIMITS_MS 5000
#define LEVELS 16
static uint64_t limits[LEVELS];
static size_t limit_len[LEVELS]; /* the part of dir naming that level */
static int limited_levels;
static uint64_t limits_read_ms; /* CLOCK_MONOTONIC; 0: not read */

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u + 1; /* never 0 */
}

static void read_limits(void)
{
    const char *lim = is_v1 ? "memory.limit_in_bytes" : "memory.max";
    size_t len = strlen(dir);
    limited_levels = 0;
    for (int level = 0; level < LEVELS; level++) {
        uint64_t limit;
        if (read_value(dir, len, lim, &limit) && limit != UINT64_MAX) {
            limits[limited_levels] = limit;
            limit_len[limited_levels++] = len;
        }
        if (len <= mount_len)
            break;
        len = parent_len(dir, len, mount_len);
    }
}

static uint64_t cgroup_headroom(void)
{
    uint64_t now = mono_ms();
    if (!limits_read_ms || now - limits_read_ms >= LIMITS_MS) {
        read_limits();
        limits_read_ms = now;
    }
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < limited_levels; i++) {
        uint64_t usage;
        if (read_usage(dir, limit_len[i], &usage)) {
            uint64_t room = limits[i] > usage ? limits[i] - usage : 0;
            if (room < best)
                best = room;
        }
    }
    return best;
}

uint64_t fa_pressure_headroom(bool *cgroup_limited)
{
    ensure_found();
    uint64_t best = state == 1 ? cgroup_headroom() : UINT64_MAX;
    *cgroup_limited = best != UINT64_MAX;
    char *mi = scratch.text;
    uint64_t avail;
    if (fa_read_file("/proc/meminfo", mi, sizeof scratch.text) > 0 && fa_pressure_parse_meminfo(mi, &avail) && avail < best)
        best = avail;
    return best;
}

void fa_pressure_reset(void)
{
    state = 0;
    lock = 0;
    limited_levels = 0;
    limits_read_ms = 0;
}

void fa_pressure_use_sources(const char *proc_cgroup_path, const char *mountinfo_path)
{
    sources.cgroup = proc_cgroup_path;
    sources.mountinfo = mountinfo_path;
    fa_pressure_reset();
}
