/* forgealloc.h - the public API of libforgealloc.so.
 *
 * The library is meant to be preloaded (LD_PRELOAD); these functions let a
 * program that runs under it read its statistics and give memory back.
 * They are found with dlsym(RTLD_DEFAULT, ...) or, from Python,
 * ctypes.CDLL(None).forgealloc_stats_json; a program that links the library
 * directly can call them as usual.  None of them allocates through the
 * malloc family, and all are thread-safe. */
#ifndef FORGEALLOC_H
#define FORGEALLOC_H

#include <stddef.h>
#include <stdint.h>

#define FORGEALLOC_VERSION_MAJOR 0
#define FORGEALLOC_VERSION_MINOR 2
#define FORGEALLOC_VERSION_PATCH 0
#define FORGEALLOC_VERSION "0.2.0"

#if defined(__GNUC__)
#define FA_API __attribute__((visibility("default")))
#else
#define FA_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* "0.2.0": the version of the library actually loaded. */
FA_API const char *forgealloc_version(void);

/* Render the current statistics as JSON (schema "forgealloc.stats/1", the
 * same document as FORGEALLOC_STATS=json) into buf.  Returns the length of
 * the complete document; if that is >= len the output was truncated (but
 * still NUL-terminated), so call again with a larger buffer. */
FA_API size_t forgealloc_stats_json(char *buf, size_t len);

/* Write the current statistics to an open file descriptor in `format`:
 * "text", "json" or "prometheus" (NULL: FORGEALLOC_STATS, or text if that
 * is off).  Returns 0, or -1 with errno set (EINVAL for an unknown format). */
FA_API int forgealloc_stats_write(int fd, const char *format);

/* Read one number by its JSON key, e.g. "host.calls.malloc",
 * "host.bytes_requested", "host.interposed", "host.tcmalloc.heap_size" or
 * "device.0.pool_bytes" (device index into device.devices[]).
 * Returns 0 and sets *value, or -1 if the key is unknown. */
FA_API int forgealloc_stat(const char *key, uint64_t *value);

/* Path of the library that serves malloc for the process: this library
 * when it comes first in the preload order, else the allocator ahead of it
 * (then forgealloc_stat("host.interposed") is 0).  "" if unknown. */
FA_API const char *forgealloc_malloc_served_by(void);

/* Return free memory held by the allocator to the operating system.
 * Returns the number of bytes returned. */
FA_API size_t forgealloc_release(void);

/* Every FORGEALLOC_* setting as a JSON array of objects with name, type,
 * default, effective value, source and doc.  Same contract as
 * forgealloc_stats_json for buf/len and the return value. */
FA_API size_t forgealloc_options_json(char *buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif
