/* parent.h - did the parent process start as this one did?
 *
 * The library is preloaded into a whole process tree: a line at start that
 * only the environment decides (a bad setting, the preload order) would be
 * printed by every process of it, and into the stderr a program captures
 * from its children (git, pip).  The first process of the tree prints it;
 * its children, started alike, keep quiet. */
#ifndef FA_PARENT_H
#define FA_PARENT_H

#include <stdbool.h>
#include <stddef.h>

/* True when the parent process has this very library loaded (the object
 * holding this code, by device and inode, in /proc/PPID/maps) and started
 * with the same first entry as envp for each of `names` and for
 * FORGEALLOC_LOG (absent from both counts as the same), as its initial
 * environment (/proc/PPID/environ) shows.  False whenever that cannot be
 * told: the parent gone or replaced while looking, /proc unreadable, the
 * parent another user's.  No malloc, no stdio, only the kernel's calls and
 * a few KiB of stack: safe at the first allocation, before tcmalloc or
 * libc are ready.  errno is kept. */
bool fa_parent_started_alike(char *const *envp, const char *const *names, size_t n);

/* The same for the environment block in an open file (NUL-separated
 * entries, as /proc/PID/environ): true when, for each name (and
 * FORGEALLOC_LOG), its first entry there equals its first in envp.  Read
 * to the end or the first difference; false when the read fails. */
bool fa_env_block_alike(int fd, char *const *envp, const char *const *names, size_t n);

#endif
