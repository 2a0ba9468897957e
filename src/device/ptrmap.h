/* ptrmap.h - pointer -> (device, size) for allocations the driver served
 * directly, so cudaFree can count them and in_use_bytes stays exact.
 * Open addressing with linear probing; grows at half load. */
#ifndef FA_PTRMAP_H
#define FA_PTRMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct fa_ptrmap_entry {
    uintptr_t key; /* 0 empty, 1 deleted */
    size_t size;
    int device;
} fa_ptrmap_entry;

typedef struct fa_ptrmap {
    fa_ptrmap_entry *slots;
    size_t cap, used, live;
} fa_ptrmap;

bool fa_ptrmap_put(fa_ptrmap *m, uintptr_t key, int device, size_t size);
/* Remove key; true and its device and size if it was there. */
bool fa_ptrmap_take(fa_ptrmap *m, uintptr_t key, int *device, size_t *size);
/* Remove every entry of one device (cudaDeviceReset). */
void fa_ptrmap_drop_device(fa_ptrmap *m, int device);
void fa_ptrmap_clear(fa_ptrmap *m);

#endif
