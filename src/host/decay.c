/* decay.c - the sliding window of free-memory minima and demand (see decay.h). */
#include "decay.h"

#include <string.h>

void fa_decay_init(fa_decay *d, uint64_t window_ms, uint64_t now_ms)
{
    memset(d, 0, sizeof *d);
    d->slot_ms = window_ms / (FA_DECAY_SLOTS - 1);
    if (d->slot_ms == 0)
        d->slot_ms = 1;
    d->slot_start = now_ms;
    /* min[] starts at 0: no slot has seen idle memory yet; high[] at 0:
     * no fall can start in a slot nobody saw. */
}

/* A new slot starts at the levels last seen. */
static void open_slot(fa_decay *d, unsigned i)
{
    d->min[i] = d->last;
    d->high[i] = d->low[i] = d->last_unused;
    d->fall[i] = 0;
}

void fa_decay_advance(fa_decay *d, uint64_t now_ms)
{
    if (now_ms < d->slot_start + d->slot_ms)
        return;
    uint64_t passed = (now_ms - d->slot_start) / d->slot_ms;
    if (passed >= FA_DECAY_SLOTS) {
        /* A whole window went by without a sample: the levels held all along. */
        for (unsigned i = 0; i < FA_DECAY_SLOTS; i++)
            open_slot(d, i);
        d->slot_start += passed * d->slot_ms;
        return;
    }
    for (uint64_t k = 0; k < passed; k++) {
        d->cur = (d->cur + 1) % FA_DECAY_SLOTS;
        open_slot(d, d->cur);
    }
    d->slot_start += passed * d->slot_ms;
}

void fa_decay_observe(fa_decay *d, uint64_t now_ms, uint64_t free_bytes, uint64_t unused_bytes)
{
    fa_decay_advance(d, now_ms);
    unsigned c = d->cur;
    if (free_bytes < d->min[c])
        d->min[c] = free_bytes;
    if (d->high[c] > unused_bytes && d->high[c] - unused_bytes > d->fall[c])
        d->fall[c] = d->high[c] - unused_bytes;
    if (unused_bytes > d->high[c])
        d->high[c] = unused_bytes;
    if (unused_bytes < d->low[c])
        d->low[c] = unused_bytes;
    d->last = free_bytes;
    d->last_unused = unused_bytes;
}

uint64_t fa_decay_idle(const fa_decay *d)
{
    uint64_t m = d->min[0];
    for (unsigned i = 1; i < FA_DECAY_SLOTS; i++)
        if (d->min[i] < m)
            m = d->min[i];
    return m < d->last ? m : d->last;
}

uint64_t fa_decay_demand(const fa_decay *d)
{
    /* Oldest slot first: a fall across slots runs from the highest sample
     * of an earlier slot to the lowest of a later one. */
    uint64_t most = 0, high = 0;
    for (unsigned k = 1; k <= FA_DECAY_SLOTS; k++) {
        unsigned i = (d->cur + k) % FA_DECAY_SLOTS;
        if (d->fall[i] > most)
            most = d->fall[i];
        if (high > d->low[i] && high - d->low[i] > most)
            most = high - d->low[i];
        if (d->high[i] > high)
            high = d->high[i];
    }
    return most;
}

void fa_decay_released(fa_decay *d, uint64_t bytes)
{
    for (unsigned i = 0; i < FA_DECAY_SLOTS; i++)
        d->min[i] = d->min[i] > bytes ? d->min[i] - bytes : 0;
    d->last = d->last > bytes ? d->last - bytes : 0;
}
