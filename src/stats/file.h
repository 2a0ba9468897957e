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

/* Expand "%p" to pid and "%%" to "%" in tmpl.  False if it does not fit. */
bool fa_path_expand(const char *tmpl, int pid, char *out, size_t cap);

/* Write data to path atomically.  Returns 0, or an errno value (the file
 * is then absent and no temporary is left behind).  *tmp_out, if given,
 * receives the temporary's name while it exists so a signal handler can
 * remove it; it is emptied again before return.  After the first
 * successful write of a process, temporaries left in the same directory by
 * processes that no longer exist (killed mid-dump) are removed. */
int fa_file_write_atomic(const char *path, const char *data, size_t len, char *tmp_out, size_t tmp_cap);

/* Remove temporaries that processes no longer alive (killed mid-dump by
 * SIGKILL) left in the directory of `path`. */
void fa_file_sweep_stale(const char *path);

/* "Permission denied"-style text for the errno values a stats file meets;
 * "error N" for others.  (strerror may allocate for translations.) */
const char *fa_errno_text(int err, char *buf, size_t cap);

#endif
