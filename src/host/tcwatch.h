/* tcwatch.h - notice, without seeing a call, that a tcmalloc serving malloc
 * ahead of forgealloc grew large enough to hold free memory worth returning.
 *
 * When a start script preloads tcmalloc ahead of libforgealloc.so, no
 * malloc or free reaches forgealloc: the release policy can only watch
 * tcmalloc's numbers from the background thread.  A heap no larger than the
 * release threshold never holds free memory beyond it, so that thread is
 * needed only once the heap has grown past it: a shell, `ls` or `git` under
 * such a preload never gets one. */
#ifndef FA_TCWATCH_H
#define FA_TCWATCH_H

#include <stdbool.h>
#include <stdint.h>

/* Call `large` once tcmalloc's heap is larger than `bytes`: at once when it
 * already is, else at the first large allocation after it grew past it
 * (from inside that allocation, with no lock of tcmalloc's held; never from
 * a small one, which may be the dynamic loader's).  Watches through
 * tcmalloc's own hooks, which cost the allocations nothing until then. */
void fa_tcwatch_start(uint64_t bytes, void (*large)(void));

/* True once `large` was called (in this process or, before a fork, its
 * parent). */
bool fa_tcwatch_fired(void);

#endif
