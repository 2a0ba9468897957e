/* parent.c - did the parent process start as this one did (parent.h)?
 *
 * Asked only where a line is about to be printed.  Everything goes through
 * the kernel's calls and the stack: the first allocation of a process may
 * be the one that loads the settings, before tcmalloc or libc are ready. */
#define _GNU_SOURCE
#include "parent.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "fmt.h"
#include "log.h"
#include "sys.h"

#define MAX_NAMES 8
#define ID_MAX 64 /* "fd:01 1234567": a mapping's device and inode */

/* A name ends at its NUL or at '=': an environment entry may be passed. */
static size_t name_len(const char *name) { return strcspn(name, "="); }

/* ---- the environment ------------------------------------------------------ */

struct want {
    const char *key;
    size_t keylen;
    const char *own; /* the value in envp, NULL when absent */
    size_t ownlen;
    bool resolved, same; /* the parent's first entry for key was seen, and equals ours */
    /* within the entry being read */
    bool alive, hit, differs; /* still matching "key=", matched it, its value differs */
    size_t pos;               /* bytes of the key matched, then of the value */
};

static const char *own_value(char *const *envp, const char *key, size_t keylen)
{
    for (char *const *e = envp; e && *e; e++)
        if (strncmp(*e, key, keylen) == 0 && (*e)[keylen] == '=')
            return *e + keylen + 1;
    return NULL;
}

/* The names asked for and FORGEALLOC_LOG (it decides whether a warning is
 * printed at all): their count, 0 when there are too many. */
static size_t wants_init(struct want *w, char *const *envp, const char *const *names, size_t n)
{
    static const char log_name[] = "FORGEALLOC_LOG";
    size_t k = 0;
    bool has_log = false;
    if (n >= MAX_NAMES)
        return 0;
    for (size_t i = 0; i <= n; i++) {
        const char *key = i < n ? names[i] : log_name;
        size_t len = name_len(key);
        if (i == n && has_log)
            break;
        has_log |= len == sizeof log_name - 1 && memcmp(key, log_name, len) == 0;
        memset(&w[k], 0, sizeof w[k]);
        w[k].key = key;
        w[k].keylen = len;
        w[k].own = own_value(envp, key, len);
        w[k].ownlen = w[k].own ? strlen(w[k].own) : 0;
        w[k].alive = true;
        k++;
    }
    return k;
}

/* One byte of the block, not a NUL. */
static void want_byte(struct want *w, char c)
{
    if (w->resolved || !w->alive)
        return;
    if (!w->hit) {
        if (w->pos < w->keylen) {
            if (c == w->key[w->pos])
                w->pos++;
            else
                w->alive = false;
        } else if (c == '=') {
            w->hit = true;
            w->pos = 0;
            w->differs = !w->own;
        } else {
            w->alive = false;
        }
    } else if (!w->differs) {
        if (w->pos < w->ownlen && w->own[w->pos] == c)
            w->pos++;
        else
            w->differs = true;
    }
}

/* The end of an entry.  False once a name's first entry differs. */
static bool want_end(struct want *w)
{
    if (!w->resolved && w->hit) {
        w->resolved = true;
        w->same = !w->differs && w->pos == w->ownlen;
    }
    w->alive = true;
    w->hit = w->differs = false;
    w->pos = 0;
    return !w->resolved || w->same;
}

bool fa_env_block_alike(int fd, char *const *envp, const char *const *names, size_t n)
{
    struct want w[MAX_NAMES];
    size_t k = wants_init(w, envp, names, n);
    if (k == 0)
        return false;
    int saved = errno;
    char buf[1024];
    bool mid = false, alike = true, done = false;
    while (!done && alike) {
        ssize_t got = fa_sys_read(fd, buf, sizeof buf);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            alike = false;
            break;
        }
        if (got == 0) { /* the end: a last entry without its NUL ends here */
            for (size_t i = 0; mid && i < k; i++)
                alike &= want_end(&w[i]);
            for (size_t i = 0; i < k; i++)
                if (!w[i].resolved) /* not in the parent's block */
                    alike &= !w[i].own;
            break;
        }
        for (ssize_t j = 0; j < got && alike && !done; j++) {
            if (buf[j] == '\0') {
                done = true;
                for (size_t i = 0; i < k; i++) {
                    alike &= want_end(&w[i]);
                    done &= w[i].resolved;
                }
                mid = false;
            } else {
                mid = true;
                for (size_t i = 0; i < k; i++)
                    want_byte(&w[i], buf[j]);
            }
        }
    }
    errno = saved;
    return alike;
}

/* ---- the library in the parent -------------------------------------------- */

static const char *skip_field(const char *s)
{
    while (*s && *s != ' ')
        s++;
    while (*s == ' ')
        s++;
    return s;
}

/* A line of /proc/PID/maps: "lo-hi perms offset dev inode  path".  The
 * range, and "dev inode" (into id) for a mapping of a file. */
static bool map_line(const char *line, uintptr_t *lo, uintptr_t *hi, const char **id, size_t *idlen)
{
    const char *s;
    if (!fa_maps_range(line, lo, hi, &s))
        return false;
    s = skip_field(skip_field(s)); /* perms, offset */
    const char *dev = s;
    const char *inode = skip_field(dev);
    size_t n = strcspn(inode, " ");
    if (inode == dev || n == 0 || (n == 1 && inode[0] == '0')) /* anonymous */
        return false;
    *id = dev;
    *idlen = (size_t)(inode + n - dev);
    return true;
}

struct find {
    uintptr_t addr; /* self: the line that holds it */
    char id[ID_MAX];
    size_t idlen;
    bool found;
};

static bool find_self(char *line, void *arg)
{
    struct find *f = arg;
    uintptr_t lo, hi;
    const char *id;
    size_t n;
    if (map_line(line, &lo, &hi, &id, &n) && f->addr >= lo && f->addr < hi) {
        if (n < sizeof f->id) {
            memcpy(f->id, id, n);
            f->idlen = n;
            f->found = true;
        }
        return false;
    }
    return true;
}

static bool find_same(char *line, void *arg)
{
    struct find *f = arg;
    uintptr_t lo, hi;
    const char *id;
    size_t n;
    if (map_line(line, &lo, &hi, &id, &n) && n == f->idlen && memcmp(id, f->id, n) == 0) {
        f->found = true;
        return false;
    }
    return true;
}

static void proc_path(fa_buf *b, char *storage, size_t cap, pid_t pid, const char *what)
{
    fa_buf_init(b, storage, cap);
    fa_buf_str(b, "/proc/");
    fa_buf_u64(b, (uint64_t)pid);
    fa_buf_putc(b, '/');
    fa_buf_str(b, what);
}

bool fa_parent_started_alike(char *const *envp, const char *const *names, size_t n)
{
    int saved = errno;
    pid_t ppid = getppid(); /* 0: the parent is outside our pid namespace */
    bool alike = false;
    char path[64];
    fa_buf b;
    if (ppid > 0) {
        proc_path(&b, path, sizeof path, ppid, "environ");
        int fd = fa_sys_open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            alike = fa_env_block_alike(fd, envp, names, n);
            fa_sys_close(fd);
        }
    }
    if (alike) {
        struct find self = {.addr = (uintptr_t)(void *)fa_parent_started_alike};
        fa_read_lines("/proc/self/maps", find_self, &self);
        struct find parent = self;
        parent.found = false;
        proc_path(&b, path, sizeof path, ppid, "maps");
        alike = self.found && fa_read_lines(path, find_same, &parent) && parent.found;
    }
    /* Still our parent: not one that exited while we looked, its pid
     * perhaps another process's by now. */
    alike = alike && getppid() == ppid;
    errno = saved;
    return alike;
}
