/* log.h - one-line messages to stderr, built on the stack and written with
 * write(2): safe inside malloc, at exit and in signal handlers. */
#ifndef FA_LOG_H
#define FA_LOG_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "options.h"

/* Print "forgealloc: <message>\n" to stderr when `level` is enabled by
 * FORGEALLOC_LOG.  Messages are one line for a person: what is wrong and
 * what to do, naming the variable. */
void fa_log(enum fa_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
bool fa_log_enabled(enum fa_log_level level);
/* The longest line fa_log prints, newline included. */
#define FA_LOG_LINE_MAX 1024
/* fa_log with the line built in the caller's storage (FA_LOG_LINE_MAX
 * bytes) instead of on the stack: for a signal handler, whose buffers are
 * static. */
void fa_log_into(char *storage, enum fa_log_level level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* SIGPIPE blocked around a write to a descriptor the program may have
 * left without a reader: the write fails with EPIPE instead.  Restoring
 * takes back a SIGPIPE that write raised (`raised`: it failed with EPIPE);
 * one that was pending before stays pending. */
typedef struct fa_sigpipe_guard {
    sigset_t old;
    bool masked, was_pending;
    bool xfsz, xfsz_was_pending; /* fa_write_all's guard takes SIGXFSZ too */
} fa_sigpipe_guard;
void fa_sigpipe_block(fa_sigpipe_guard *g);
void fa_sigpipe_restore(fa_sigpipe_guard *g, bool raised);

/* Write all of buf to fd, retrying on EINTR and short writes.  Returns 0
 * or the errno value of the failure; errno itself is left unchanged. */
int fa_write_all(int fd, const char *buf, size_t len);
/* fa_write_all to fd 2 for lines and dumps nobody called for (messages,
 * the configured dump): EBADF without writing when fd 2 is no longer the
 * process's stderr (closed, or reopened by the program as a data file). */
int fa_write_stderr(const char *buf, size_t len);
/* Note what fd 2 is: called once at start. */
void fa_stderr_note(void);

/* Read up to cap-1 bytes of a small file (procfs, sysfs) into buf, NUL-
 * terminated.  Returns the length, or -1.  No stdio: signal-safe. */
long fa_read_file(const char *path, char *buf, size_t cap);

/* Call fn(line, arg) for each line of a small file (procfs), read through a
 * stack buffer: no stdio, no malloc.  The newline is cut off; a line longer
 * than 4 KiB is skipped whole; a last line without a newline counts.  fn
 * returns false to stop.  False if the file cannot be opened. */
bool fa_read_lines(const char *path, bool (*fn)(char *line, void *arg), void *arg);

/* The address range "lo-hi " that starts a line of /proc/PID/maps, and the
 * rest of the line after it (the permissions first).  False for anything
 * else, hex digits past 64 bits included. */
bool fa_maps_range(const char *line, uintptr_t *lo, uintptr_t *hi, const char **rest);

/* fa_warn for a line at start that only the environment decides (a bad
 * setting, the preload order): the first process of a tree prints it, and
 * a process whose parent has the library loaded and started with the same
 * first entry for each of `names` (and FORGEALLOC_LOG) in its environment
 * keeps quiet (parent.h): the line was printed there already, or asked
 * not to be.  envp is what this process read the names from. */
void fa_warn_tree(char *const *envp, const char *const *names, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define fa_error(...) fa_log(FA_LOG_ERROR, __VA_ARGS__)
#define fa_warn(...) fa_log(FA_LOG_WARN, __VA_ARGS__)
#define fa_info(...) fa_log(FA_LOG_INFO, __VA_ARGS__)
#define fa_debug(...) fa_log(FA_LOG_DEBUG, __VA_ARGS__)

#endif
