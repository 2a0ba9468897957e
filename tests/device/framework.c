/* framework.c - libfakeframework.so, a tiny stand-in for a GPU framework.
 *
 * Like torch's libc10_cuda.so it links libcudart.so.13 (DT_NEEDED) and
 * calls it directly.  Tests dlopen it with RTLD_LOCAL from a program that
 * does not link cudart, as Python loads torch, to check that a preloaded
 * shim still sees these calls. */
#include "fakecuda.h"

FAKECUDA_API int fw_malloc(void **p, size_t n) { return cudaMalloc(p, n); }

FAKECUDA_API int fw_free(void *p) { return cudaFree(p); }

FAKECUDA_API int fw_mem_get_info(size_t *f, size_t *t) { return cudaMemGetInfo(f, t); }

FAKECUDA_API int fw_sync(void) { return cudaDeviceSynchronize(); }
