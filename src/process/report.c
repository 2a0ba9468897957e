/* report.c - snapshot the process and deliver the rendering (report.h).
 *
 * Rendering uses static buffers (untouched pages cost no memory), never
 * malloc: one set for ordinary dumps, guarded by a flag, and one for a
 * signal handler that may have interrupted an ordinary dump, guarded by the
 * id of the thread using it (two signals may land on two threads at once).
 * Keeping them static also keeps the signal path's stack use small. */
#define _GNU_SOURCE
#include "report.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/log.h"
#include "../core/owner.h"
#include "../core/parent.h"
#include "../device/device.h"
#include "../host/host.h"
#include "../stats/file.h"
#include "../stats/render.h"

#define OUT_CAP (256 * 1024)

static char out_buf[OUT_CAP], sig_buf[OUT_CAP];
static fa_snapshot snap_main, snap_sig;
static int busy;
static bool forked;
static bool warned_write;
static bool pruned; /* FORGEALLOC_STATS_KEEP applied in this process */
static fa_file_scratch file_main, file_sig;
static char path_main[FA_FILE_NAME_CAP], path_sig[FA_FILE_NAME_CAP];
static int sig_owner; /* thread id of the signal dump under way, 0 if none */

void fa_snapshot_take(fa_snapshot *s, const char *reason, bool in_signal)
{
    fa_owner_adopt(); /* a child of a fork without handlers reports as a forked one */
    memset(s, 0, sizeof *s);
    s->reason = reason;
    s->in_signal = in_signal;
    s->pid = (int)getpid();
    s->ppid = (int)getppid();
    s->forked = forked;
    int saved = errno; /* readlink fails where /proc is missing (a chroot, a sandbox) */
    ssize_t n = readlink("/proc/self/exe", s->exe, sizeof s->exe - 1);
    s->exe[n > 0 ? n : 0] = '\0';
    errno = saved;
    fa_options_copy(s->settings);
    fa_host_fill(s);
    fa_device_fill(s);
}

/* A child of a fork without handlers first takes the state over: the
 * parent's thread may have been in the middle of a dump. */
static void lock_main(void)
{
    fa_owner_adopt();
    while (__atomic_exchange_n(&busy, 1, __ATOMIC_ACQUIRE))
        sched_yield();
}

static void unlock_main(void) { __atomic_store_n(&busy, 0, __ATOMIC_RELEASE); }

int fa_report_fd(int fd, enum fa_stats_format fmt, const char *reason)
{
    lock_main();
    fa_snapshot_take(&snap_main, reason, false);
    fa_buf b;
    fa_buf_init(&b, out_buf, sizeof out_buf);
    fa_render(&b, &snap_main, fmt);
    int err = fa_write_all(fd, b.p, b.len);
    unlock_main();
    return err;
}

void fa_report_malloc_stats(void) { fa_report_fd(2, FA_STATS_TEXT, "malloc_stats"); }

size_t fa_report_json(char *buf, size_t len, const char *reason)
{
    lock_main();
    fa_snapshot_take(&snap_main, reason, false);
    fa_buf b;
    fa_buf_init(&b, buf, len);
    fa_render_json(&b, &snap_main);
    unlock_main();
    return b.need;
}

/* %t of the stats path: fixed at the first dump of the process so every
 * later dump (interval, exit) goes to the same file. */
static uint64_t start_ms;

static uint64_t start_unix_ms(const fa_snapshot *s)
{
    uint64_t t = __atomic_load_n(&start_ms, __ATOMIC_RELAXED);
    if (t == 0) {
        t = s->time_unix_ms > s->uptime_ms ? s->time_unix_ms - s->uptime_ms : s->time_unix_ms;
        uint64_t expect = 0;
        if (!__atomic_compare_exchange_n(&start_ms, &expect, t, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            t = expect;
    }
    return t;
}

static bool secure_mode(void) { return getauxval(AT_SECURE) != 0; }

/* stdout as the library found it: glibc's own stream object, which lives as
 * long as the process.  A program may point stdout elsewhere (or at NULL)
 * and free what it pointed at; glibc's exit flush never reads stdout. */
static FILE *start_stdout;

/* FORGEALLOC_STATS_FILE made absolute at start when it is relative: the
 * file goes where the process started, not wherever it is at exit (a
 * program that chdirs, `git -C repo`), with each % of that directory
 * written %% (a directory named 50%pct is no %p).  Empty: the setting as
 * it is. */
static char file_abs[4096];

static const char *file_template(void)
{
    return file_abs[0] ? file_abs : fa_opt(FA_OPT_STATS_FILE)->s;
}

void fa_report_start(void)
{
    start_stdout = stdout;
    const char *t = fa_opt(FA_OPT_STATS_FILE)->s;
    if (!t || t[0] == '/' || strcmp(t, "-") == 0)
        return;
    int saved = errno;
    char cwd[sizeof file_abs];
    fa_buf b;
    fa_buf_init(&b, file_abs, sizeof file_abs);
    if (getcwd(cwd, sizeof cwd)) {
        for (const char *c = cwd; *c; c++) {
            if (*c == '%')
                fa_buf_putc(&b, '%');
            fa_buf_putc(&b, *c);
        }
        fa_buf_putc(&b, '/');
        fa_buf_str(&b, t);
    }
    if (!b.len || fa_buf_overflowed(&b))
        file_abs[0] = '\0'; /* no directory, or too long: the setting as it is */
    errno = saved;
}

/* exit() flushes stdio only after the last destructor, so an exit dump on a
 * stderr that shares a file with stdout (2>&1) would land ahead of the
 * program's last buffered lines.  Then, and only then, stdout is flushed
 * first: glibc's own stdout, if no other thread holds it, and if its reader
 * is still there (a failed flush drops the buffer, so exit would no longer
 * raise the SIGPIPE it raises without forgealloc). */
static void flush_stdout(void)
{
    FILE *f = stdout;
    if (!f || f != start_stdout || ftrylockfile(f) != 0)
        return;
    int saved = errno;
    int fd = fileno_unlocked(f);
    struct stat out, err;
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    if (fd >= 0 && fstat(fd, &out) == 0 && fstat(2, &err) == 0 && out.st_dev == err.st_dev &&
        out.st_ino == err.st_ino && poll(&p, 1, 0) >= 0 && !(p.revents & (POLLERR | POLLHUP | POLLNVAL))) {
        fa_sigpipe_guard guard;
        fa_sigpipe_block(&guard);
        errno = 0;
        bool failed = fflush_unlocked(f) == EOF;
        fa_sigpipe_restore(&guard, failed && errno == EPIPE); /* the reader left just now */
    }
    funlockfile(f);
    errno = saved;
}

bool fa_report_signal_enter(void)
{
    fa_owner_adopt();
    int self = (int)gettid();
    for (;;) {
        int owner = 0;
        if (__atomic_compare_exchange_n(&sig_owner, &owner, self, false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            return true;
        if (owner == self)
            return false;
        sched_yield();
    }
}

void fa_report_signal_leave(void) { __atomic_store_n(&sig_owner, 0, __ATOMIC_RELEASE); }

/* A path in a message: its start and its end around "...", when it is
 * longer than SHOWN_PATH bytes (the line keeps its reason and remedy). */
#define SHOWN_PATH 160
static const char *shorten(const char *path, char out[SHOWN_PATH + 4])
{
    size_t n = strlen(path);
    if (n <= SHOWN_PATH)
        return path;
    size_t head = SHOWN_PATH / 2, tail = SHOWN_PATH - head;
    memcpy(out, path, head);
    memcpy(out + head, "...", 3);
    memcpy(out + head + 3, path + n - tail, tail + 1);
    return out;
}

/* A failure that the settings alone decide (a missing or read-only
 * directory, a name too long), where the parent process started with the
 * same ones: the parent says it, or said it, once for the tree (a forked
 * worker pool, a shell's commands), when it writes that file too.  A full
 * disk or a quota may hit one process and not its parent: said by each.
 * Not checked in a signal handler, whose stack (a sigaltstack of 8 KiB)
 * has no room for it. */
static bool same_failure_in_parent(int err)
{
    static const char *const names[] = {"FORGEALLOC_STATS", "FORGEALLOC_STATS_FILE"};
    if ((uint64_t)getppid() == fa_opt_u64(FA_OPT_STATS_MAIN_PID))
        return false; /* the launcher's command: its own dump goes to stderr, it never tries the file */
    switch (err) {
    case ENOENT: case ENOTDIR: case EACCES: case EPERM: case EROFS: case ENAMETOOLONG: case ELOOP: case EISDIR:
        return fa_parent_started_alike(environ, names, sizeof names / sizeof names[0]);
    default:
        return false;
    }
}

void fa_report_configured(const char *reason, bool in_signal)
{
    enum fa_stats_format fmt = (enum fa_stats_format)fa_opt_u64(FA_OPT_STATS);
    if (fmt == FA_STATS_OFF)
        return;
    /* The launcher's own command reports on stderr at exit, its children
     * to files (FORGEALLOC_STATS_MAIN_PID).  Privileged (setuid/setgid) processes
     * take no file paths from the environment: stderr too. */
    const char *tmpl = file_template();
    bool main_exit = (uint64_t)getpid() == fa_opt_u64(FA_OPT_STATS_MAIN_PID) && strcmp(reason, "interval") != 0;
    bool to_stderr = !tmpl || strcmp(tmpl, "-") == 0 || main_exit || secure_mode();
    if (to_stderr && !in_signal && strcmp(reason, "exit") == 0)
        flush_stdout(); /* before taking the buffers: it may block on a full pipe */
    char *buf = out_buf;
    fa_snapshot *s = &snap_main;
    fa_file_scratch *file = &file_main;
    char *path = path_main;
    if (in_signal) {
        buf = sig_buf;
        s = &snap_sig;
        file = &file_sig;
        path = path_sig;
    } else {
        lock_main();
    }
    fa_snapshot_take(s, reason, in_signal);
    fa_buf b;
    fa_buf_init(&b, buf, OUT_CAP);
    fa_render(&b, s, fmt);
    if (to_stderr) {
        fa_write_stderr(b.p, b.len);
    } else {
        int err = ENAMETOOLONG;
        fa_path_parts parts;
        fa_path_parts_here(&parts, s->pid, start_unix_ms(s));
        bool expanded = fa_path_expand(tmpl, &parts, path, sizeof path_main);
        if (expanded)
            err = fa_file_write_atomic(path, b.p, b.len, file);
        /* Once per process, after its first file: others' old ones go. */
        if (!err && !__atomic_exchange_n(&pruned, true, __ATOMIC_RELAXED))
            fa_file_prune(tmpl, path, (unsigned)fa_opt_u64(FA_OPT_STATS_KEEP), file);
        /* The parent check reads /proc on its own stack: not on a signal's. */
        if (err && !__atomic_exchange_n(&warned_write, true, __ATOMIC_RELAXED) &&
            (in_signal || !same_failure_in_parent(err))) {
            char eb[32], shown[SHOWN_PATH + 4];
            /* The line is built in buf: the rendering is not needed any more. */
            fa_log_into(buf, FA_LOG_WARN,
                        "cannot write stats to '%s': %s; set FORGEALLOC_STATS_FILE to a writable path, or - for stderr",
                        shorten(expanded ? path : tmpl, shown), fa_errno_text(err, eb, sizeof eb));
        }
    }
    if (!in_signal)
        unlock_main();
}

void fa_report_abandon(void)
{
    if (__atomic_load_n(&file_main.tmp[0], __ATOMIC_ACQUIRE))
        unlink(file_main.tmp);
    if (__atomic_load_n(&file_sig.tmp[0], __ATOMIC_ACQUIRE))
        unlink(file_sig.tmp);
}

void fa_report_fork_child(void)
{
    forked = true;
    start_ms = 0;
    busy = 0;
    sig_owner = 0;
    warned_write = false;
    pruned = false;
    file_main.tmp[0] = file_sig.tmp[0] = '\0';
}
