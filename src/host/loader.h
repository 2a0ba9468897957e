/* loader.h - whether a call comes from the dynamic loader (ld.so).
 *
 * glibc frees the thread-local blocks of dlopen'd libraries from ld.so
 * (_dl_deallocate_tls) while it holds the lock of its stack cache, inside
 * pthread_join and thread exit.  pthread_create takes that lock, so a free
 * coming from there must not start the background thread. */
#ifndef FA_LOADER_H
#define FA_LOADER_H

#include <stdbool.h>

/* Find ld.so's mapped range (once; cheap afterwards).  Call at start,
 * outside any allocation: it walks the loaded objects. */
void fa_loader_init(void);

/* True when `ret` (a return address) lies in ld.so.  False before
 * fa_loader_init and where ld.so cannot be found. */
bool fa_from_loader(const void *ret);

#endif
