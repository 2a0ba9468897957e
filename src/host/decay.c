/* decay.c - the sliding window of free-memory minima (see decay.h). */
#include "decay.h"

#include <string.h>

void fa_decay_init(fa_decay *d, uint64_t window_ms, uint64_t now_ms)
{
    memset(d, 0, sizeof *d);
    d->slot_ms = window_ms / (FA_DECAY_SLOTS - 1);
    if (d->slot_ms == 0)
        d->slot_ms = 1;
    d->slot_start = now_ms;
    /* min[] starts at 0: no slot has seen idle memory yet. */
}

void fa_decay_advance(fa_decay *d, uint64_t now_ms)
{
    if (now_ms < d->slot_start + d->slot_ms)
        return;
    uint64_t passed = (now_ms - d->slot_start) / d->slot_ms;
    if (passed >= FA_DECAY_SLOTS) {
        /* A whole window went by without a sample: the level held all along. */
        for (unsigned i = 0; i < FA_DECAY_SLOTS; i++)
            d->min[i] = d->last;
        d->slot_start += passed * d->slot_ms;
        return;
    }
    for (uint64_t k = 0; k < passed; k++) {
        d->cur = (d->cur + 1) % FA_DECAY_SLOTS;
        d->min[d->cur] = d->last;
    }
    d->slot_start += passed * d->slot_ms;
}

void fa_decay_observe(fa_decay *d, uint64_t now_ms, uint64_t free_bytes)
{
    fa_decay_advance(d, now_ms);
    if (free_bytes < d->min[d->cur])
        d->min[d->cur] = free_bytes;
    d->last = free_bytes;
}

uint64_t fa_decay_idle(const fa_decay *d)
{
    uint64_t m = d->min[0];
    for (unsigned i = 1; i < FA_DECAY_SLOTS; i++)
        if (d->min[i] < m)
            m = d->min[i];
    return m < d->last ? m : d->last;
}

void fa_decay_released(fa_decay *d, uint64_t bytes)
{
    for (unsigned i = 0; i < FA_DECAY_SLOTS; i++)
        d->min[i] = d->min[i] > bytes ? d->min[i] - bytes : 0;
    d->last = d->last > bytes ? d->last - bytes : 0;
}
