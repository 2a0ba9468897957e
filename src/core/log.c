/* log.c - one-line messages to stderr without malloc or stdio. */
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "parent.h"
#include "sys.h"

/* How long a write may wait for a reader that does not read (a full pipe
 * or FIFO on a descriptor in non-blocking mode) before the rest is given
 * up: the dump must not hold the process at exit. */
#define STALL_MS 1000

/* Block SIGPIPE, and with xfsz SIGXFSZ, noting which were pending. */
static void guard_block(fa_sigpipe_guard *g, bool xfsz)
{
    sigset_t set, pending;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    if (xfsz)
        sigaddset(&set, SIGXFSZ);
    g->xfsz = xfsz;
    g->masked = pthread_sigmask(SIG_BLOCK, &set, &g->old) == 0;
    bool known = g->masked && sigpending(&pending) == 0;
    g->was_pending = !known || sigismember(&pending, SIGPIPE);
    g->xfsz_was_pending = !known || sigismember(&pending, SIGXFSZ);
}

/* Take back the signal that the failure err raised (EPIPE: SIGPIPE,
 * EFBIG: SIGXFSZ) unless it was pending before; unblock. */
static void guard_restore(fa_sigpipe_guard *g, int err)
{
    if (!g->masked)
        return;
    int sig = err == EPIPE && !g->was_pending ? SIGPIPE : err == EFBIG && g->xfsz && !g->xfsz_was_pending ? SIGXFSZ : 0;
    if (sig) {
        sigset_t one;
        sigemptyset(&one);
        sigaddset(&one, sig);
        static const struct timespec now = {0, 0};
        while (sigtimedwait(&one, NULL, &now) < 0 && errno == EINTR)
            ;
    }
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

void fa_sigpipe_block(fa_sigpipe_guard *g) { guard_block(g, false); }
void fa_sigpipe_restore(fa_sigpipe_guard *g, bool raised) { guard_restore(g, raised ? EPIPE : 0); }

/* SIGPIPE and SIGXFSZ are blocked while writing: a reader that went away,
 * or a file at the size limit (ulimit -f), makes the write fail with EPIPE
 * or EFBIG instead of killing a program that never wrote there itself. */
int fa_write_all(int fd, const char *buf, size_t len)
{
    int saved = errno, err = 0;
    fa_sigpipe_guard guard;
    guard_block(&guard, true);
    while (len) {
        ssize_t n = fa_sys_write(fd, buf, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            int r = poll(&p, 1, STALL_MS);
            if (r > 0 || (r < 0 && errno == EINTR))
                continue;
            err = r == 0 ? ETIMEDOUT : errno;
            break;
        }
        if (n <= 0) {
            err = n < 0 ? errno : EIO;
            break;
        }
        buf += n;
        len -= (size_t)n;
    }
    guard_restore(&guard, err);
    errno = saved;
    return err;
}

/* What fd 2 was when the process started: 0 not looked at yet, 1 open
 * (err_dev, err_ino), 2 closed. */
static int err_state;
static dev_t err_dev;
static ino_t err_ino;

void fa_stderr_note(void)
{
    int saved = errno;
    struct stat st;
    if (fstat(2, &st) == 0) {
        err_dev = st.st_dev;
        err_ino = st.st_ino;
        __atomic_store_n(&err_state, 1, __ATOMIC_RELEASE);
    } else {
        __atomic_store_n(&err_state, 2, __ATOMIC_RELEASE);
    }
    errno = saved;
}

/* fd 2 is stderr still: the file it was at the start, or one the program
 * redirected it to on purpose (a terminal or pipe, or a file opened for
 * appending, as a log is).  A program that closed fd 2 and opened a file
 * or a socket of its own (which then got fd 2: a daemon's accepted client)
 * must not find our lines in its data, nor one that started without
 * stderr. */
static bool stderr_usable(void)
{
    int saved = errno;
    struct stat st;
    bool ok = fstat(2, &st) == 0;
    int state = __atomic_load_n(&err_state, __ATOMIC_ACQUIRE);
    if (ok && state == 2)
        ok = false;
    else if (ok && state == 1 && (st.st_dev != err_dev || st.st_ino != err_ino)) {
        if (S_ISSOCK(st.st_mode)) {
            ok = false;
        } else if (S_ISREG(st.st_mode)) {
            int fl = fcntl(2, F_GETFL);
            ok = fl >= 0 && (fl & O_APPEND) && (fl & O_ACCMODE) == O_WRONLY;
        }
    }
    errno = saved;
    return ok;
}

int fa_write_stderr(const char *buf, size_t len) { return stderr_usable() ? fa_write_all(2, buf, len) : EBADF; }

long fa_read_file(const char *path, char *buf, size_t cap)
{
    int saved = errno;
    int fd = fa_sys_open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = -1;
    if (fd >= 0) {
        n = fa_sys_read(fd, buf, cap - 1);
        fa_sys_close(fd);
    }
    buf[n > 0 ? n : 0] = '\0';
    errno = saved;
    return (long)n;
}

bool fa_read_lines(const char *path, bool (*fn)(char *line, void *arg), void *arg)
{
    int saved = errno;
    int fd = fa_sys_open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        errno = saved;
        return false;
    }
    char buf[4096];
    size_t have = 0;
    bool skipping = false, more = true; /* skipping: inside a line longer than buf */
    while (more) {
        ssize_t got = fa_sys_read(fd, buf + have, sizeof buf - 1 - have);
        if (got < 0 && errno == EINTR)
            continue;
        bool eof = got <= 0;
        if (!eof)
            have += (size_t)got;
        buf[have] = '\0';
        char *line = buf, *nl;
        while (more && ((nl = strchr(line, '\n')) || (eof && *line))) {
            if (nl)
                *nl = '\0';
            if (!skipping)
                more = fn(line, arg);
            skipping = false;
            line = nl ? nl + 1 : buf + have;
        }
        if (eof)
            break;
        have = (size_t)(buf + have - line);
        if (have == sizeof buf - 1) { /* no newline in a full buffer */
            skipping = true;
            have = 0;
        }
        memmove(buf, line, have);
    }
    fa_sys_close(fd);
    errno = saved;
    return true;
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
    for (size_t i = 0; i < b.len; i++) /* one line, whatever a path or a setting holds */
        if ((unsigned char)storage[i] < 0x20 || storage[i] == 0x7f)
            storage[i] = '?';
    storage[b.len] = '\n';
    fa_write_stderr(storage, b.len + 1);
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

void fa_warn_tree(char *const *envp, const char *const *names, size_t n, const char *fmt, ...)
{
    if (!fa_log_enabled(FA_LOG_WARN) || fa_parent_started_alike(envp, names, n))
        return;
    char storage[FA_LOG_LINE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vlog(storage, FA_LOG_WARN, fmt, ap);
    va_end(ap);
}

static bool hex(const char **s, uintptr_t *out)
{
    uintptr_t v = 0;
    const char *p = *s;
    for (;; p++) {
        unsigned d;
        if (*p >= '0' && *p <= '9')
            d = (unsigned)(*p - '0');
        else if (*p >= 'a' && *p <= 'f')
            d = (unsigned)(*p - 'a' + 10);
        else
            break;
        if (v >> (sizeof v * 8 - 4))
            return false;
        v = v << 4 | d;
    }
    if (p == *s)
        return false;
    *s = p;
    *out = v;
    return true;
}

bool fa_maps_range(const char *line, uintptr_t *lo, uintptr_t *hi, const char **rest)
{
    const char *p = line;
    if (!hex(&p, lo) || *p++ != '-' || !hex(&p, hi) || *p++ != ' ')
        return false;
    *rest = p;
    return true;
}
