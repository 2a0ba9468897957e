/* file.c - atomic stats files (see file.h). */
#define _GNU_SOURCE
#include "file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <stdio.h> /* rename */
#include <string.h>
#include <unistd.h>

#include "../core/fmt.h"
#include "../core/log.h"

bool fa_path_expand(const char *tmpl, int pid, char *out, size_t cap)
{
    fa_buf b;
    fa_buf_init(&b, out, cap);
    for (const char *c = tmpl; *c; c++) {
        if (c[0] == '%' && c[1] == 'p') {
            fa_buf_i64(&b, pid);
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

/* "<anything>.tmp-<pid>-<seq>": one of our temporaries; returns its pid. */
static long temp_owner(const char *name)
{
    const char *t = NULL;
    for (const char *c = name; (c = strstr(c, ".tmp-")); c++)
        t = c;
    if (!t)
        return -1;
    long pid = 0;
    const char *c = t + 5;
    for (; *c >= '0' && *c <= '9'; c++)
        pid = pid * 10 + (*c - '0');
    if (c == t + 5 || *c++ != '-' || *c < '0' || *c > '9')
        return -1;
    while (*c >= '0' && *c <= '9')
        c++;
    return *c ? -1 : pid;
}

/* getdents64 on a stack buffer: no malloc, usable at exit and in a signal
 * handler. */
void fa_file_sweep_stale(const char *path)
{
    char dir[4200];
    const char *slash = strrchr(path, '/');
    size_t n = slash ? (size_t)(slash - path) : 0;
    if (n >= sizeof dir)
        return;
    if (slash && n == 0)
        n = 1; /* "/" */
    memcpy(dir, slash ? path : ".", slash ? n : 1);
    dir[slash ? n : 1] = '\0';
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return;
    char buf[4096];
    long got;
    while ((got = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0) {
        for (long off = 0; off < got;) {
            struct dirent64 *e = (struct dirent64 *)(buf + off);
            off += e->d_reclen;
            long pid = temp_owner(e->d_name);
            if (pid > 0 && pid != (long)getpid() && kill((pid_t)pid, 0) != 0 && errno == ESRCH)
                unlinkat(fd, e->d_name, 0);
        }
    }
    close(fd);
}

int fa_file_write_atomic(const char *path, const char *data, size_t len, char *tmp_out, size_t tmp_cap)
{
    static unsigned seq;
    char tmp[4200];
    fa_buf b;
    fa_buf_init(&b, tmp, sizeof tmp);
    fa_buf_printf(&b, "%s.tmp-%d-%u", path, (int)getpid(), __atomic_add_fetch(&seq, 1, __ATOMIC_RELAXED));
    if (fa_buf_overflowed(&b))
        return ENAMETOOLONG;
    int fd = -1;
    for (int attempt = 0; attempt < 2 && fd < 0; attempt++) {
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd < 0 && errno == EEXIST && attempt == 0)
            unlink(tmp); /* left by a killed process with our pid; unlink never follows */
        else if (fd < 0)
            return errno;
    }
    if (fd < 0)
        return EEXIST;
    if (tmp_out && tmp_cap > b.len)
        memcpy(tmp_out, tmp, b.len + 1);
    int err = fa_write_all(fd, data, len);
    if (close(fd) != 0 && !err)
        err = errno;
    if (!err && rename(tmp, path) != 0)
        err = errno;
    if (err)
        unlink(tmp);
    if (tmp_out && tmp_cap)
        tmp_out[0] = '\0';
    /* Once per process: later (interval) dumps would only rescan. */
    static int swept;
    if (!err && !__atomic_exchange_n(&swept, 1, __ATOMIC_RELAXED))
        fa_file_sweep_stale(path);
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
    case EXDEV: return "rename across file systems";
    default: {
        fa_buf b;
        fa_buf_init(&b, buf, cap);
        fa_buf_printf(&b, "error %d", err);
        return buf;
    }
    }
}
