/* ptrmap.c - pointer map for driver-served allocations (see ptrmap.h). */
#include "ptrmap.h"

#include <stdint.h>
#include <stdlib.h>

enum { EMPTY = 0, DELETED = 1 };

static size_t slot(uintptr_t key, size_t cap) { return (size_t)((key >> 9) * 0x9E3779B97F4A7C15ull) & (cap - 1); }

static bool grow(fa_ptrmap *m)
{
    size_t cap = m->cap ? m->cap * 2 : 64;
    fa_ptrmap_entry *slots = calloc(cap, sizeof *slots);
    if (!slots)
        return false;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->slots[i].key <= DELETED)
            continue;
        size_t j = slot(m->slots[i].key, cap);
        while (slots[j].key != EMPTY)
            j = (j + 1) & (cap - 1);
        slots[j] = m->slots[i];
    }
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    m->used = m->live;
    return true;
}

bool fa_ptrmap_put(fa_ptrmap *m, uintptr_t key, int device, size_t size)
{
    if ((m->used + 1) * 2 > m->cap && !grow(m))
        return false;
    size_t free_slot = SIZE_MAX, j = slot(key, m->cap);
    for (;; j = (j + 1) & (m->cap - 1)) {
        if (m->slots[j].key == key) { /* replace */
            m->slots[j] = (fa_ptrmap_entry){key, size, device};
            return true;
        }
        if (m->slots[j].key == DELETED && free_slot == SIZE_MAX)
            free_slot = j;
        if (m->slots[j].key == EMPTY)
            break;
    }
    if (free_slot == SIZE_MAX) {
        free_slot = j;
        m->used++;
    }
    m->slots[free_slot] = (fa_ptrmap_entry){key, size, device};
    m->live++;
    return true;
}

bool fa_ptrmap_take(fa_ptrmap *m, uintptr_t key, int *device, size_t *size)
{
    if (!m->cap || key <= DELETED)
        return false;
    for (size_t j = slot(key, m->cap);; j = (j + 1) & (m->cap - 1)) {
        if (m->slots[j].key == EMPTY)
            return false;
        if (m->slots[j].key == key) {
            *device = m->slots[j].device;
            *size = m->slots[j].size;
            m->slots[j].key = DELETED;
            m->live--;
            return true;
        }
    }
}

void fa_ptrmap_drop_device(fa_ptrmap *m, int device)
{
    for (size_t i = 0; i < m->cap; i++) {
        if (m->slots[i].key > DELETED && m->slots[i].device == device) {
            m->slots[i].key = DELETED;
            m->live--;
        }
    }
}

void fa_ptrmap_clear(fa_ptrmap *m)
{
    free(m->slots);
    *m = (fa_ptrmap){0};
}
