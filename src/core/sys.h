/* sys.h - the file calls the library makes for itself, made straight to
 * the kernel, and the page size.
 *
 * A program may preload other libraries that wrap open, read or write
 * (tracers, sandboxes, path rewriters), and such a wrapper may allocate.
 * The library reads /proc while tcmalloc holds its page-heap lock
 * (startfill.c) and from inside malloc calls, and writes its dump from
 * signal handlers: an allocation from a wrapper there could wait for a
 * lock its own thread holds, for ever.  errno is set on failure, as by
 * libc's functions. */
#ifndef FA_SYS_H
#define FA_SYS_H

#include <fcntl.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

static inline int fa_sys_open(const char *path, int flags) { return (int)syscall(SYS_openat, AT_FDCWD, path, flags, 0); }
static inline ssize_t fa_sys_read(int fd, void *buf, size_t n) { return (ssize_t)syscall(SYS_read, fd, buf, n); }
static inline ssize_t fa_sys_pread(int fd, void *buf, size_t n, off_t at)
{
    return (ssize_t)syscall(SYS_pread64, fd, buf, n, at);
}
static inline ssize_t fa_sys_write(int fd, const void *buf, size_t n) { return (ssize_t)syscall(SYS_write, fd, buf, n); }
static inline int fa_sys_close(int fd) { return (int)syscall(SYS_close, fd); }

/* The page size, read once (sysconf; 4096 where it gives none). */
size_t fa_page_size(void);

#endif
