/* served.h - who serves malloc for the process.
 *
 * A start script may preload another allocator ahead of libforgealloc.so
 * (LD_PRELOAD="libtcmalloc.so.4 libforgealloc.so"): then the global symbol
 * lookup finds its malloc, not ours.  Decided once at start; read anywhere. */
#ifndef FA_SERVED_H
#define FA_SERVED_H

#include <stdbool.h>
#include <stddef.h>

#include "../stats/snapshot.h"

struct fa_snapshot;

/* At library start (constructor, where dlsym and dladdr may allocate):
 * find the definition of malloc the global lookup finds and, when it is
 * not ours, print one warning line naming it and the fix. */
void fa_host_served_check(void);

/* FA_SERVER_SELF until fa_host_served_check ran. */
enum fa_malloc_server fa_host_malloc_server(void);

/* True when malloc is served, ahead of forgealloc, by the very tcmalloc
 * instance forgealloc's own tc_* and MallocExtension_* calls reach: its
 * numbers are the process's and releasing through it works, but no call
 * is seen by forgealloc. */
bool fa_host_served_by_same_tcmalloc(void);

/* Path of the library that serves malloc ("" until known). */
const char *fa_host_served_by(void);

/* Fill the malloc-server part of a snapshot (signal-safe: reads only).
 * When another allocator serves malloc, tcmalloc's numbers are marked
 * invalid: they are not the process's. */
void fa_host_served_fill(struct fa_snapshot *s);

#endif
