/* pressure.h - how much memory the process can still get before a limit
 * makes the kernel kill something: the limit of its memory cgroup (v2
 * memory.max and memory.current; v1 memory.limit_in_bytes and
 * memory.usage_in_bytes, less the inactive page cache in memory.stat; the
 * cgroup and each ancestor up to the root of the mount) and the machine's
 * MemAvailable.  Files are read with read(2) into static buffers: one
 * caller at a time (the release policy's tick), on any thread, with little
 * of its stack; never allocates. */
#ifndef FA_PRESSURE_H
#define FA_PRESSURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Bytes that can still be charged before the tightest limit is reached;
 * UINT64_MAX when nothing is known.  *cgroup_limited: a memory cgroup with a
 * finite limit governs the process. */
uint64_t fa_pressure_headroom(bool *cgroup_limited);

/* Forget the cgroup found (after fork the child may be moved elsewhere). */
void fa_pressure_reset(void);

/* ---- parsing, exposed for unit tests ---- */

/* From the text of /proc/self/cgroup and one line of /proc/self/mountinfo,
 * the directory of the process's memory cgroup under that mount, if the
 * line mounts the v2 hierarchy or the v1 memory controller.  *v1 says
 * which.  Returns false when the line is neither. */
bool fa_pressure_cgroup_dir(const char *proc_cgroup, const char *mountinfo_line, char *dir, size_t cap, bool *v1,
                            size_t *mount_len);

/* Read the process's cgroups and mounts from these files instead of
 * /proc/self/cgroup and /proc/self/mountinfo; forgets the cgroup found. */
void fa_pressure_use_sources(const char *proc_cgroup_path, const char *mountinfo_path);

/* A limit file's value: "max" (v2) and v1's "no limit" (above 2^62) read as
 * UINT64_MAX.  False if it is not a number. */
bool fa_pressure_parse_limit(const char *text, uint64_t *out);

/* The value of `key` in the text of a memory.stat file ("key value" lines). */
bool fa_pressure_parse_stat(const char *text, const char *key, uint64_t *out);

/* MemAvailable from the text of /proc/meminfo, in bytes. */
bool fa_pressure_parse_meminfo(const char *text, uint64_t *out);

#endif
