/* file.c - atomic stats files (see file.h). */
#include "file.h"

#include <errno.h>
#include <fcntl.h>
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
