/* fakecudadrv.c - the stand-in's libcuda.so.1: the driver functions a
 * program linked with libcuda calls by name (cuMemAlloc_v2, cuMemCreate,
 * cuMemAllocAsync, cuGetProcAddress_v2, ...), each a forward to the
 * stand-in runtime's own (fakecuda_driver_function), as NVIDIA's runtime
 * and driver share one implementation. */
#include "fakecuda.h"

#define FAKECUDADRV_API __attribute__((visibility("default")))

typedef fa_cu_result (*alloc_fn)(fa_cu_ptr *, size_t);
typedef fa_cu_result (*free_fn)(fa_cu_ptr);
typedef fa_cu_result (*async_fn)(fa_cu_ptr *, size_t, cudaStream_t);
typedef fa_cu_result (*create_fn)(fa_cu_handle *, size_t, const fa_cu_alloc_prop *, unsigned long long);
typedef fa_cu_result (*release_fn)(fa_cu_handle);
typedef fa_cu_result (*proc_fn)(const char *, void **, int, fa_cu_u64, fa_cu_proc_status *);

#define FORWARD(type, name) ((type)fakecuda_driver_function(name))

FAKECUDADRV_API fa_cu_result cuMemAlloc_v2(fa_cu_ptr *p, size_t n) { return FORWARD(alloc_fn, "cuMemAlloc")(p, n); }
FAKECUDADRV_API fa_cu_result cuMemFree_v2(fa_cu_ptr p) { return FORWARD(free_fn, "cuMemFree")(p); }
FAKECUDADRV_API fa_cu_result cuMemAllocAsync(fa_cu_ptr *p, size_t n, cudaStream_t s)
{
    return FORWARD(async_fn, "cuMemAllocAsync")(p, n, s);
}
FAKECUDADRV_API fa_cu_result cuMemAllocAsync_ptsz(fa_cu_ptr *p, size_t n, cudaStream_t s)
{
    return FORWARD(async_fn, "cuMemAllocAsync")(p, n, s);
}
FAKECUDADRV_API fa_cu_result cuMemCreate(fa_cu_handle *h, size_t n, const fa_cu_alloc_prop *prop,
                                          unsigned long long flags)
{
    return FORWARD(create_fn, "cuMemCreate")(h, n, prop, flags);
}
FAKECUDADRV_API fa_cu_result cuMemRelease(fa_cu_handle h) { return FORWARD(release_fn, "cuMemRelease")(h); }
FAKECUDADRV_API fa_cu_result cuGetProcAddress_v2(const char *sym, void **fn, int version, fa_cu_u64 flags,
                                                  fa_cu_proc_status *status)
{
    return FORWARD(proc_fn, "cuGetProcAddress")(sym, fn, version, flags, status);
}
