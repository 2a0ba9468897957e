/* file.c - atomic stats files (see file.h). */
#define _GNU_SOURCE
#include "file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <stdio.h> /* rename */
#include <string.h>
#include <unistd.h>

#include "../core/fmt.h"
#include "../core/log.h"

/* The characters %h keeps of a hostname (others become '_'). */
static bool host_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' ||
           c == '_';
}

void fa_path_parts_here(fa_path_parts *parts, int pid, uint64_t start_unix_ms)
{
    parts->pid = pid;
    parts->start_unix_ms = start_unix_ms;
    struct utsname u;
    const char *h = uname(&u) == 0 && u.nodename[0] ? u.nodename : "localhost";
    size_t i = 0;
    for (; h[i] && i < sizeof parts->host - 1; i++)
        parts->host[i] = host_char(h[i]) ? h[i] : '_'; /* a file name part: no '/' */
    parts->host[i] = '\0';
}

bool fa_path_expand(const char *tmpl, const fa_path_parts *parts, char *out, size_t cap)
{
    fa_buf b;
    fa_buf_init(&b, out, cap);
    for (const char *c = tmpl; *c; c++) {
        if (c[0] == '%' && c[1] == 'p') {
            fa_buf_i64(&b, parts->pid);
            c++;
        } else if (c[0] == '%' && c[1] == 'h') {
            fa_buf_str(&b, parts->host);
            c++;
        } else if (c[0] == '%' && c[1] == 't') {
            fa_buf_u64(&b, parts->start_unix_ms);
            c++;
        } else if (c[0] == '%' && c[1] == '%') {
            fa_buf_putc(&b, '%');
            c++;
        } else {
            fa_buf_putc(&b, *c);
        }
    }
    return !fa_buf_overflowed(&b) && b.len > 0;
}

bool fa_file_ns_tag(char out[17])
{
    char boot[64], ns[64];
    if (fa_read_file("/proc/sys/kernel/random/boot_id", boot, sizeof boot) <= 0)
        return false;
    ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
    if (n <= 0)
        return false;
    ns[n] = '\0';
    uint64_t h = 14695981039346656037ull; /* FNV-1a */
    for (const char *c = boot; *c; c++)
        h = (h ^ (unsigned char)*c) * 1099511628211ull;
    for (const char *c = ns; *c; c++)
        h = (h ^ (unsigned char)*c) * 1099511628211ull;
    for (int i = 15; i >= 0; i--, h >>= 4)
        out[i] = "0123456789abcdef"[h & 15];
    out[16] = '\0';
    return true;
}

/* "<anything>.tmp-<tag>-<pid>-<seq>" with our own tag: one of our
 * temporaries, made by a process of our pid namespace; returns its pid.
 * Anything else (another container's, an older name) is not provably ours. */
static long temp_owner(const char *name, const char *tag)
{
    const char *t = NULL;
    for (const char *c = name; (c = strstr(c, ".tmp-")); c++)
        t = c;
    if (!t || strncmp(t + 5, tag, 16) != 0 || t[21] != '-')
        return -1;
    long pid = 0;
    const char *c = t + 22;
    for (; *c >= '0' && *c <= '9' && pid < 100000000; c++)
        pid = pid * 10 + (*c - '0');
    if (c == t + 22 || *c++ != '-' || *c < '0' || *c > '9')
        return -1;
    while (*c >= '0' && *c <= '9')
        c++;
    return *c ? -1 : pid;
}

/* The directory part of path into dir (cap bytes): "." when there is none. */
static bool dir_of(const char *path, char *dir, size_t cap)
{
    const char *slash = strrchr(path, '/');
    size_t n = slash ? (size_t)(slash - path) : 1;
    if (slash && n == 0)
        n = 1; /* "/" */
    if (n >= cap)
        return false;
    memcpy(dir, slash ? path : ".", n);
    dir[n] = '\0';
    return true;
}

/* getdents64 into the caller's scratch: no malloc, usable at exit and in
 * a signal handler.  A temporary is removed only when it carries our
 * namespace tag (same kernel boot, same pid namespace) and its pid is gone:
 * on a volume shared between containers, another container's pids mean
 * nothing here. */
void fa_file_sweep_stale(const char *path, fa_file_scratch *scratch)
{
    char tag[17];
    if (!fa_file_ns_tag(tag))
        return;
    char *dir = scratch->work;
    if (!dir_of(path, dir, sizeof scratch->work))
        return;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return;
    long got;
    while ((got = syscall(SYS_getdents64, fd, scratch->dents, sizeof scratch->dents)) > 0) {
        for (long off = 0; off < got;) {
            struct dirent64 *e = (struct dirent64 *)(scratch->dents + off);
            off += e->d_reclen;
            long pid = temp_owner(e->d_name, tag);
            if (pid > 0 && pid != (long)getpid() && kill((pid_t)pid, 0) != 0 && errno == ESRCH)
                unlinkat(fd, e->d_name, 0);
        }
    }
    close(fd);
}

/* Backtracking, within a budget of steps (a name that would need more is
 * taken as no match). */
static bool match_from(const char *p, const char *n, unsigned *budget)
{
    for (;;) {
        if (*budget == 0)
            return false;
        (*budget)--;
        if (p[0] == '%' && (p[1] == 'p' || p[1] == 't' || p[1] == 'h')) {
            /* %t: Unix milliseconds, 13 digits (2001 to 2286); %p: a pid,
             * at most 7 digits; %h: at most 64 hostname characters. */
            bool host = p[1] == 'h';
            size_t least = p[1] == 't' ? 13 : 1, most = p[1] == 't' ? 13 : p[1] == 'p' ? 7 : 64;
            size_t k = 0;
            while (k < most && ((n[k] >= '0' && n[k] <= '9') || (host && n[k] && host_char(n[k]))))
                k++;
            for (; k >= least; k--)
                if (match_from(p + 2, n + k, budget))
                    return true;
            return false;
        }
        char c = p[0];
        if (c == '%' && p[1] == '%')
            p++;
        if (c == '\0')
            return n[0] == '\0';
        if (n[0] != c)
            return false;
        p++;
        n++;
    }
}

bool fa_file_name_matches(const char *tmpl, const char *name)
{
    const char *slash = strrchr(tmpl, '/');
    unsigned budget = 20000;
    return strstr(name, ".tmp-") == NULL && match_from(slash ? slash + 1 : tmpl, name, &budget);
}

/* Does the regular file `name` in fd begin as a stats dump does (text,
 * JSON or Prometheus)?  Only such files are ever removed. */
static bool is_dump(int fd, const char *name)
{
    static const char *const heads[] = {"forgealloc ", "{\"schema\":\"forgealloc.stats/", "# HELP forgealloc_"};
    char head[40];
    int f = openat(fd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (f < 0)
        return false;
    ssize_t n = read(f, head, sizeof head);
    close(f);
    for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++) {
        size_t len = strlen(heads[i]);
        if (n >= (ssize_t)len && memcmp(head, heads[i], len) == 0)
            return true;
    }
    return false;
}

/* Was a file modified at (sec, nsec) before the one o records? */
static bool older(int64_t sec, long nsec, const struct fa_file_oldest *o)
{
    return sec < o->sec || (sec == o->sec && nsec < o->nsec);
}

/* Entries of the open directory fd that match tmpl, other than `own`:
 * counted by name (pick 0, confirm false), counted when they are dumps
 * (confirm), or (pick) the oldest dumps among them recorded in
 * scratch->oldest, oldest first.  Returns the count, or how many were
 * picked. */
static size_t prune_scan(int fd, const char *tmpl, const char *own, fa_file_scratch *s, size_t pick, bool confirm)
{
    enum { CAP = sizeof s->oldest / sizeof s->oldest[0] };
    size_t n = 0;
    if (lseek(fd, 0, SEEK_SET) != 0)
        return 0;
    long got;
    while ((got = syscall(SYS_getdents64, fd, s->dents, sizeof s->dents)) > 0) {
        for (long off = 0; off < got;) {
            struct dirent64 *e = (struct dirent64 *)(s->dents + off);
            off += e->d_reclen;
            if (strcmp(e->d_name, own) == 0 || strlen(e->d_name) >= sizeof s->oldest[0].name ||
                !fa_file_name_matches(tmpl, e->d_name))
                continue;
            if (!pick && !confirm) {
                n++;
                continue;
            }
            struct stat st;
            if (fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
                continue;
            if (!pick) {
                n += is_dump(fd, e->d_name);
                continue;
            }
            int64_t sec = st.st_mtim.tv_sec;
            long nsec = st.st_mtim.tv_nsec;
            size_t limit = pick < CAP ? pick : CAP;
            size_t i = n < limit ? n : limit;
            if (i == limit && !older(sec, nsec, &s->oldest[i - 1]))
                continue; /* newer than every one kept */
            if (!is_dump(fd, e->d_name))
                continue; /* a file of somebody else's that happens to have such a name */
            if (i == limit)
                i--; /* the newest kept makes room */
            for (; i > 0 && older(sec, nsec, &s->oldest[i - 1]); i--)
                s->oldest[i] = s->oldest[i - 1];
            s->oldest[i].sec = sec;
            s->oldest[i].nsec = nsec;
            strcpy(s->oldest[i].name, e->d_name);
            if (n < limit)
                n++;
        }
    }
    return n;
}

void fa_file_prune(const char *tmpl, const char *path, unsigned keep, fa_file_scratch *scratch)
{
    if (keep == 0 || !dir_of(path, scratch->work, sizeof scratch->work))
        return;
    const char *slash = strrchr(path, '/');
    const char *own = slash ? slash + 1 : path;
    int fd = open(scratch->work, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return;
    /* One process prunes at a time: processes that end together (a worker
     * pool) would each remove the whole excess.  One that finds another at
     * it leaves the work to it.  Each round counts again, so what others
     * removed meanwhile is not removed twice. */
    if (flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
        close(fd);
        return;
    }
    /* Only dumps count: files of somebody else's that happen to match the
     * pattern take no dump's place.  Names are counted first, as that
     * needs no file opened: almost always they are few enough. */
    size_t target = keep - keep / 10; /* own file included */
    size_t others = prune_scan(fd, tmpl, own, scratch, 0, false);
    if (others + 1 > keep && target > 0)
        others = prune_scan(fd, tmpl, own, scratch, 0, true);
    if (others + 1 > keep && target > 0) {
        for (int round = 0; round < 16 && others + 1 > target; round++) {
            size_t picked = prune_scan(fd, tmpl, own, scratch, others + 1 - target, false);
            size_t gone = 0;
            for (size_t i = 0; i < picked; i++)
                gone += unlinkat(fd, scratch->oldest[i].name, 0) == 0;
            if (gone == 0)
                break;
            others = prune_scan(fd, tmpl, own, scratch, 0, true);
        }
    }
    close(fd); /* and the lock with it */
}

/* Write data to fd (opened O_NONBLOCK) and close it: a FIFO's reader that
 * does not read is waited for a bounded time, one that went away is an
 * error (EPIPE), never a SIGPIPE (fa_write_all). */
static int append_fd(int fd, const char *data, size_t len)
{
    if (fd < 0)
        return errno;
    int err = fa_write_all(fd, data, len);
    if (close(fd) != 0 && !err)
        err = errno;
    return err;
}

#define APPEND_FLAGS (O_WRONLY | O_APPEND | O_NONBLOCK | O_NOCTTY | O_CLOEXEC)

/* Only a regular file is replaced: renaming over a device (/dev/null), a
 * FIFO or a symbolic link (/dev/stderr) would replace the node itself, for
 * every other program too.  Those are appended to, as a shell's >> would
 * (a link to a log must not truncate it; O_NONBLOCK: a FIFO nobody reads
 * fails at once, ENXIO).  A link is followed only when root or this user
 * made it, and is opened itself (O_PATH) so that its owner and its target
 * are read from the same link: one swapped in after the check is never
 * followed.  A link somebody else made (planted in a shared directory,
 * pointing at a file of ours) is replaced, never written through; so is a
 * regular file, whose permissions *mode receives (0: none, or absent).
 * Returns an errno value, 0, or -1: replace path. */
static int append_special(const char *path, const char *data, size_t len, fa_file_scratch *scratch, mode_t *mode)
{
    *mode = 0;
    char *name = scratch->work;
    if (!dir_of(path, name, sizeof scratch->work))
        return -1;
    int dir = open(name, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0)
        return -1; /* the replacement reports why */
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    int res = -1;
    struct stat st;
    int node = openat(dir, base, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (node >= 0 && fstat(node, &st) == 0) {
        if (S_ISREG(st.st_mode)) {
            *mode = st.st_mode & 0777;
        } else if (!S_ISLNK(st.st_mode)) {
            res = append_fd(openat(dir, base, APPEND_FLAGS | O_NOFOLLOW), data, len);
        } else if (st.st_uid == 0 || st.st_uid == geteuid()) {
            ssize_t n = readlinkat(node, "", name, sizeof scratch->work - 1);
            if (n < 0) {
                res = errno;
            } else if ((size_t)n >= sizeof scratch->work - 1) {
                res = ENAMETOOLONG;
            } else {
                name[n] = '\0'; /* relative to the link's directory, as the kernel resolves it */
                res = append_fd(openat(dir, name, APPEND_FLAGS | O_CREAT, 0644), data, len);
            }
        }
    }
    if (node >= 0)
        close(node);
    close(dir);
    return res;
}

/* Rewrite the regular file path where it is: for a file that cannot be
 * replaced (a bind mount, as docker -v FILE:PATH makes; a writable file in
 * a directory the process cannot write).  A reader may see it part
 * written, which beats no stats at all. */
static int write_in_place(const char *path, const char *data, size_t len)
{
    int fd = open(path, O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        return errno;
    struct stat st;
    int err = 0;
    if (fstat(fd, &st) != 0)
        err = errno;
    else if (!S_ISREG(st.st_mode))
        err = EBUSY; /* swapped for something else meanwhile */
    else if (ftruncate(fd, 0) != 0)
        err = errno;
    if (err) {
        close(fd);
        return err;
    }
    return append_fd(fd, data, len);
}

int fa_file_write_atomic(const char *path, const char *data, size_t len, fa_file_scratch *scratch)
{
    mode_t mode;
    int special = append_special(path, data, len, scratch, &mode);
    if (special >= 0)
        return special;
    static unsigned seq;
    char *tmp = scratch->tmp;
    fa_buf b;
    fa_buf_init(&b, scratch->work, sizeof scratch->work);
    /* The tag makes the name unique across containers sharing the
     * directory; without one (no /proc) nothing is provably ours. */
    char tag[17];
    bool ours = fa_file_ns_tag(tag);
    char suffix[64];
    fa_buf sb;
    fa_buf_init(&sb, suffix, sizeof suffix);
    fa_buf_printf(&sb, ".tmp-%s-%d-%u", ours ? tag : "untagged", (int)getpid(),
                  __atomic_add_fetch(&seq, 1, __ATOMIC_RELAXED));
    /* A name near the file system's limit (255 bytes) keeps only as much
     * of itself in the temporary's name as leaves room for the suffix. */
    const char *slash = strrchr(path, '/');
    size_t base = strlen(slash ? slash + 1 : path), keep = strlen(path);
    if (base + sb.len > NAME_MAX)
        keep -= base + sb.len - NAME_MAX < base ? base + sb.len - NAME_MAX : base;
    fa_buf_mem(&b, path, keep);
    fa_buf_mem(&b, suffix, sb.len);
    if (fa_buf_overflowed(&b))
        return ENAMETOOLONG;
    /* Published before the temporary exists, its first byte last: a
     * signal handler reading tmp finds "" or the whole name, never a
     * prefix (which could name the stats file itself). */
    memcpy(tmp + 1, scratch->work + 1, b.len);
    __atomic_store_n(&tmp[0], scratch->work[0], __ATOMIC_RELEASE);
    int fd = -1;
    for (int attempt = 0; attempt < 2 && fd < 0; attempt++) {
        /* A private file's data is never readable by others, even for a moment. */
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode ? mode : 0644);
        if (fd < 0 && errno == EEXIST && attempt == 0 && ours) {
            unlink(tmp); /* left by a killed process of our namespace with our pid; unlink never follows */
        } else if (fd < 0) {
            int err = errno;
            __atomic_store_n(&tmp[0], '\0', __ATOMIC_RELEASE);
            if (mode && (err == EACCES || err == EPERM || err == EROFS))
                return write_in_place(path, data, len); /* no new file here, but this one may be writable */
            return err;
        }
    }
    if (fd < 0) {
        __atomic_store_n(&tmp[0], '\0', __ATOMIC_RELEASE);
        return EEXIST;
    }
    int err = fa_write_all(fd, data, len);
    /* The old file's permissions: a stats file made private stays so. */
    if (!err && mode && fchmod(fd, mode) != 0)
        err = errno;
    if (close(fd) != 0 && !err)
        err = errno;
    if (!err && rename(tmp, path) != 0)
        err = errno;
    if (err)
        unlink(tmp);
    __atomic_store_n(&tmp[0], '\0', __ATOMIC_RELEASE);
    if (err == EBUSY && mode)
        err = write_in_place(path, data, len); /* a mount point cannot be replaced */
    /* Once per process: later (interval) dumps would only rescan. */
    static int swept;
    if (!err && !__atomic_exchange_n(&swept, 1, __ATOMIC_RELAXED))
        fa_file_sweep_stale(path, scratch);
    return err;
}

const char *fa_errno_text(int err, char *buf, size_t cap)
{
    switch (err) {
    case EACCES: return "permission denied";
    case EPERM: return "operation not permitted";
    case ENOENT: return "no such file or directory";
    case ENOTDIR: return "a path component is not a directory";
    case EISDIR: return "is a directory";
    case EROFS: return "read-only file system";
    case ENOSPC: return "no space left on device";
    case EDQUOT: return "disk quota exceeded";
    case ELOOP: return "too many symbolic links";
    case ENAMETOOLONG: return "file name too long";
    case EEXIST: return "file exists";
    case EBUSY: return "in use (a mount point?)";
    case EFBIG: return "file size limit reached";
    case EXDEV: return "rename across file systems";
    case ENXIO: return "nobody reads the FIFO, or it is a socket or a device with no driver";
    case EPIPE: return "the FIFO's reader went away";
    case ETIMEDOUT: return "the FIFO's reader read nothing for a second";
    default: {
        fa_buf b;
        fa_buf_init(&b, buf, cap);
        fa_buf_printf(&b, "error %d", err);
        return buf;
    }
    }
}
