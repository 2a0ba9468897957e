/* decay.h - how much free memory has stayed free for a whole window, and
 * how much the program took at once within it.
 *
 * The release policy's memory of demand, as pure arithmetic over a clock
 * and a series of samples of the bytes held free (committed, ready for
 * the next allocation) and of the bytes unused (free plus those already
 * returned to the OS, which tcmalloc commits again when it needs them).
 * The window is cut into slots, each slot keeps the lowest free sample
 * seen in it, and the bytes that were free in every slot of the window
 * were needed by nobody during it: free memory that dipped (an allocation
 * took it) stays; what was never touched for the whole window may go back
 * to the OS.  The slots also keep the highest and lowest unused samples
 * and the largest fall among them, so the window tells the largest amount
 * the program took from its heap at once (a step's buffers, whether they
 * came from free or returned memory): what memory pressure leaves it. */
#ifndef FA_DECAY_H
#define FA_DECAY_H

#include <stdbool.h>
#include <stdint.h>

/* Slots in the ring: the window is FA_DECAY_SLOTS - 1 whole slots plus the
 * current one, so "idle" always covers at least the whole window. */
#define FA_DECAY_SLOTS 9

typedef struct fa_decay {
    uint64_t slot_ms;    /* window / (FA_DECAY_SLOTS - 1); 0 = no window */
    uint64_t slot_start; /* start of the current slot, ms */
    uint64_t min[FA_DECAY_SLOTS]; /* lowest free-bytes sample per slot */
    uint64_t high[FA_DECAY_SLOTS]; /* highest unused-bytes sample per slot */
    uint64_t low[FA_DECAY_SLOTS];  /* lowest unused-bytes sample per slot */
    uint64_t fall[FA_DECAY_SLOTS]; /* largest fall of the unused bytes within the slot */
    uint64_t last;        /* latest free sample: the level carried into new slots */
    uint64_t last_unused; /* latest unused sample, likewise */
    unsigned cur;         /* index of the current slot */
} fa_decay;

/* Start a window of `window_ms` (> 0) at `now_ms`.  Until a whole window has
 * been observed, nothing counts as idle. */
void fa_decay_init(fa_decay *d, uint64_t window_ms, uint64_t now_ms);

/* Move the clock to `now_ms` (monotonic; earlier times are taken as
 * now), carrying the last samples into the slots that passed. */
void fa_decay_advance(fa_decay *d, uint64_t now_ms);

/* Record that `free_bytes` were held free and `unused_bytes` (free ones
 * included) not in use at `now_ms`. */
void fa_decay_observe(fa_decay *d, uint64_t now_ms, uint64_t free_bytes, uint64_t unused_bytes);

/* Bytes that were free throughout the whole window ending now. */
uint64_t fa_decay_idle(const fa_decay *d);

/* The largest fall of the unused bytes within the window ending now, from
 * a sample to a later, lower one: what the program took from its heap at
 * once.  A rise (a model unloaded) is not demand. */
uint64_t fa_decay_demand(const fa_decay *d);

/* `bytes` were just returned to the OS: they are no longer held free in
 * any slot (so they are not counted as idle twice); unused, they still
 * are. */
void fa_decay_released(fa_decay *d, uint64_t bytes);

/* Time of the next slot boundary, when fa_decay_idle may next grow. */
static inline uint64_t fa_decay_next_ms(const fa_decay *d) { return d->slot_start + d->slot_ms; }

#endif
