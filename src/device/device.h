/* device.h - the device side's entry points: the CUDA calls forgealloc
 * takes over (forwarded from override_cuda.c), stats for reports and the
 * fork hooks. */
#ifndef FA_DEVICE_H
#define FA_DEVICE_H

#include "../stats/snapshot.h"
#include "cuda_abi.h"

struct fa_cudart;

fa_cuda_error fa_device_malloc(void **p, size_t n);
fa_cuda_error fa_device_free(void *p);
fa_cuda_error fa_device_mem_get_info(size_t *free_b, size_t *total_b);
fa_cuda_error fa_device_reset(void);
fa_cuda_error fa_device_synchronize(void);
fa_cuda_error fa_device_ipc_get_handle(fa_cuda_ipc_handle *h, void *p);

/* Calls counted and passed through unchanged. */
void fa_device_count(enum fa_cuda_pt which);
/* The real runtime (members NULL when missing; one error line then). */
const struct fa_cudart *fa_device_runtime(const char *fn);
/* Stream captures: no synchronisation while one is in progress. */
void fa_device_capture_begun(fa_cuda_error r);
void fa_device_capture_ended(fa_cuda_error r);

/* Fill the device part of a snapshot without taking locks (signal-safe). */
void fa_device_fill(struct fa_snapshot *s);
void fa_device_fork_prepare(void);
void fa_device_fork_parent(void);
void fa_device_fork_child(void);

#endif
