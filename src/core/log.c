/* log.c - one-line messages to stderr without malloc or stdio. */
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

int fa_write_all(int fd, const char *buf, size_t len)
{
    int saved = errno, err = 0;
    while (len) {
        ssize_t n = write(fd, buf, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            err = n < 0 ? errno : EIO;
            break;
        }
        buf += n;
        len -= (size_t)n;
    }
    errno = saved;
    return err;
}

long fa_read_file(const char *path, char *buf, size_t cap)
{
    int saved = errno;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = -1;
    if (fd >= 0) {
        n = read(fd, buf, cap - 1);
        close(fd);
    }
    buf[n > 0 ? n : 0] = '\0';
    errno = saved;
    return (long)n;
}

bool fa_log_enabled(enum fa_log_level level) { return (uint64_t)level <= fa_opt_u64(FA_OPT_LOG); }

static void vlog(char *storage, enum fa_log_level level, const char *fmt, va_list ap)
{
    if (!fa_log_enabled(level))
        return;
    fa_buf b;
    fa_buf_init(&b, storage, FA_LOG_LINE_MAX - 1); /* keep room for '\n' */
    fa_buf_str(&b, "forgealloc: ");
    fa_buf_vprintf(&b, fmt, ap);
    storage[b.len] = '\n';
    fa_write_all(2, storage, b.len + 1);
}

void fa_log(enum fa_log_level level, const char *fmt, ...)
{
    char storage[FA_LOG_LINE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vlog(storage, level, fmt, ap);
    va_end(ap);
}

void fa_log_into(char *storage, enum fa_log_level level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(storage, level, fmt, ap);
    va_end(ap);
}
