/* file.h - writing stats files: complete or absent, never partial.
 *
 * The document goes to a temporary file in the same directory, created
 * with O_EXCL|O_NOFOLLOW (no symlink is followed), then rename(2) puts it
 * in place atomically.  No malloc, no stdio: usable at exit and from a
 * signal handler. */
#ifndef FA_FILE_H
#define FA_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What a stats path pattern expands to.  Pids repeat across containers
 * and restarts; hostname (Docker sets the container id) and start time
 * tell those apart. */
typedef struct fa_path_parts {
    int pid;                /* %p */
    char host[65];          /* %h: the hostname, '/' and other odd bytes as '_' */
    uint64_t start_unix_ms; /* %t: when forgealloc started in the process, Unix milliseconds */
} fa_path_parts;

/* The parts for this process (uname: async-signal-safe, no malloc). */
void fa_path_parts_here(fa_path_parts *parts, int pid, uint64_t start_unix_ms);

/* Expand "%p", "%h", "%t" and "%%" in tmpl.  False if it does not fit. */
bool fa_path_expand(const char *tmpl, const fa_path_parts *parts, char *out, size_t cap);

/* 16 hex digits naming this kernel boot and pid namespace: a temporary
 * with our tag was made by a process whose pid means the same here.
 * False when /proc cannot tell. */
bool fa_file_ns_tag(char out[17]);

/* Room for a stats file's name and its temporary's: the longest path
 * setting (4095 bytes) and the suffix. */
#define FA_FILE_NAME_CAP 4200

/* What writing a stats file needs besides the data, kept by the caller:
 * the writer runs in signal handlers, where a stack may be a few KiB, so
 * none of this is on the stack.  One per writer that may run at the same
 * time as another. */
typedef struct fa_file_scratch {
    char tmp[FA_FILE_NAME_CAP];  /* the temporary's name while it may exist, "" otherwise */
    char work[FA_FILE_NAME_CAP]; /* a name being built; the directory being swept */
    char dents[4096];            /* directory entries being swept */
    struct fa_file_oldest {      /* the oldest stats files found by a pruning pass */
        int64_t sec;
        long nsec;
        char name[256];
    } oldest[64];
} fa_file_scratch;

/* Write data to path atomically: a new file renamed over the old one,
 * with the old one's permissions.  A path that names a device, a FIFO, a
 * socket, or a symbolic link that root or this user made, is appended to
 * instead, as >> would (the link's target is created if missing; a link
 * made by anybody else is replaced).  A FIFO's reader that reads nothing
 * for a second, or goes away, fails the write (ETIMEDOUT, EPIPE).  A
 * regular file that cannot be replaced (a mount point; a writable file in a
 * directory the process cannot write) is rewritten in place.  Returns
 * 0, or an errno value (the file is then absent and no temporary is left
 * behind).  scratch->tmp holds the temporary's name while it may exist, so a signal handler can remove it
 * (a reader sees the whole name or ""); it is emptied again before
 * return.  After the first successful write of a process, temporaries left
 * in the same directory by processes of our pid namespace that no longer
 * exist (killed mid-dump) are removed. */
int fa_file_write_atomic(const char *path, const char *data, size_t len, fa_file_scratch *scratch);

/* Remove temporaries that processes of our pid namespace, no longer alive
 * (killed mid-dump by SIGKILL), left in the directory of `path`; never
 * another namespace's (a volume shared between containers).  Uses
 * scratch->work and scratch->dents. */
void fa_file_sweep_stale(const char *path, fa_file_scratch *scratch);

/* Does `name` (a file name) look like what the file-name part of the
 * pattern `tmpl` expands to: %t 13 digits, %p up to 7 digits, %h up to
 * 64 hostname characters, %% a '%'? */
bool fa_file_name_matches(const char *tmpl, const char *name);

/* Keep at most `keep` stats files of the pattern `tmpl` in the directory of
 * `path` (the file this process wrote, which stays): when there are more,
 * the oldest by modification time go until nine tenths of `keep` are left.
 * Only regular files that begin as a stats dump does; temporaries, other
 * names and other contents are left alone.  No
 * malloc (scratch->work, dents and oldest); bounded work: at most 1024 files
 * go per call. */
void fa_file_prune(const char *tmpl, const char *path, unsigned keep, fa_file_scratch *scratch);

/* "Permission denied"-style text for the errno values a stats file meets;
 * "error N" for others.  (strerror may allocate for translations.) */
const char *fa_errno_text(int err, char *buf, size_t cap);

#endif
