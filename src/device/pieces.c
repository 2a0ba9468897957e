/* pieces.c - the driver's virtual-memory calls for the pool of physical
 * pieces (vmpool.c decides what to call, this file calls it and counts),
 * and the reservation of its address space. */
#include <string.h>

#include "devstate.h"
#include "device.h"

#include "../core/log.h"
#include "../core/options.h"

static void vm_call_done(devstate *d, uint64_t t0)
{
    ST_ADD(d, driver_ns, fa_dev_now_ns() - t0);
    ST_ADD(d, driver_vm_calls, 1);
}

static int vm_create(void *c, size_t bytes, uint64_t *handle)
{
    fa_vmctx *x = c;
    fa_cu_alloc_prop prop;
    memset(&prop, 0, sizeof prop);
    prop.type = FA_CU_ALLOCATION_TYPE_PINNED;
    prop.location.type = FA_CU_LOCATION_TYPE_DEVICE;
    prop.location.id = x->dev;
    prop.allocFlags.gpuDirectRDMACapable = x->d->rdma; /* as cudaMalloc memory is, where the device can */
    fa_cu_handle h = 0;
    uint64_t t0 = fa_dev_now_ns();
    int r = x->drv->cuMemCreate(&h, bytes, &prop, 0);
    vm_call_done(x->d, t0);
    if (r == 0) {
        *handle = h;
        ST_ADD(x->d, pieces_created, 1);
    }
    return r;
}

static int vm_release(void *c, uint64_t handle)
{
    fa_vmctx *x = c;
    uint64_t t0 = fa_dev_now_ns();
    int r = x->drv->cuMemRelease((fa_cu_handle)handle);
    vm_call_done(x->d, t0);
    return r;
}

static int vm_map(void *c, uintptr_t addr, size_t bytes, uint64_t handle)
{
    fa_vmctx *x = c;
    uint64_t t0 = fa_dev_now_ns();
    int r = x->drv->cuMemMap((fa_cu_ptr)addr, bytes, 0, (fa_cu_handle)handle, 0);
    vm_call_done(x->d, t0);
    return r;
}

static int vm_unmap(void *c, uintptr_t addr, size_t bytes)
{
    fa_vmctx *x = c;
    uint64_t t0 = fa_dev_now_ns();
    int r = x->drv->cuMemUnmap((fa_cu_ptr)addr, bytes);
    vm_call_done(x->d, t0);
    return r;
}

/* cudaDeviceEnablePeerAccess does not reach mapped pieces: every device
 * the program enabled is named here, with the owner. */
static int vm_set_access(void *c, uintptr_t addr, size_t bytes)
{
    fa_vmctx *x = c;
    fa_cu_access_desc desc[FA_MAX_DEVICES];
    unsigned mask = (1u << x->dev) | __atomic_load_n(&x->d->peers, __ATOMIC_ACQUIRE);
    size_t n = 0;
    for (int p = 0; p < FA_MAX_DEVICES; p++) {
        if (!((mask >> p) & 1))
            continue;
        memset(&desc[n], 0, sizeof desc[n]);
        desc[n].location.type = FA_CU_LOCATION_TYPE_DEVICE;
        desc[n].location.id = p;
        desc[n].flags = FA_CU_ACCESS_READWRITE;
        n++;
    }
    uint64_t t0 = fa_dev_now_ns();
    int r = x->drv->cuMemSetAccess((fa_cu_ptr)addr, bytes, desc, n);
    vm_call_done(x->d, t0);
    return r;
}

const fa_vm_driver fa_pieces_driver = {vm_create, vm_release, vm_map, vm_unmap, vm_set_access};

void fa_pieces_teardown(fa_vmctx *x, fa_vm *v)
{
    if (x->drv) {
        fa_vm_release_all(v, &fa_pieces_driver, x);
        x->drv->cuMemAddressFree((fa_cu_ptr)v->base, 2 * v->zone);
    }
    fa_vm_destroy(v);
}

/* Driver calls need the device's context current on the calling thread:
 * cudaSetDevice makes it so (once per thread and device). */
static __thread unsigned bound_devices __attribute__((tls_model("initial-exec")));

void fa_pieces_bind(const fa_cudart *rt, int dev)
{
    if ((bound_devices >> dev) & 1 || !rt->cudaSetDevice)
        return;
    fa_cuda_error before = fa_err_peek(rt);
    if (rt->cudaSetDevice(dev) == 0)
        bound_devices |= 1u << dev;
    else
        fa_err_absorb(rt, before);
}

bool fa_pieces_reserve(const fa_cudart *rt, devstate *d, int dev)
{
    const char *why = NULL;
    const fa_cudrv *drv = NULL;
    int supported = 0;
    size_t gran = 0, f = 0, t = 0;
    fa_cu_ptr base = 0;
    fa_cu_alloc_prop prop;
    memset(&prop, 0, sizeof prop);
    prop.type = FA_CU_ALLOCATION_TYPE_PINNED;
    prop.location.type = FA_CU_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    fa_cuda_error before = fa_err_peek(rt);
    if (!fa_opt_u64(FA_OPT_DEVICE_VMM))
        why = "FORGEALLOC_DEVICE_VMM=0";
    else if (!rt->cudaMemGetInfo || rt->cudaMemGetInfo(&f, &t) != 0) /* also makes the context current */
        why = "cudaMemGetInfo failed";
    else if (!(drv = fa_cudrv_get(rt)))
        why = "the runtime gives no driver entry points for cuMemCreate and friends";
    else if (drv->cuDeviceGetAttribute(&supported, FA_CU_ATTR_VMM_SUPPORTED, dev) != 0 || supported != 1)
        why = "the device reports no virtual-memory management support";
    else if (drv->cuMemGetAllocationGranularity(&gran, &prop, FA_CU_GRANULARITY_MINIMUM) != 0 || !gran ||
             FA_VM_GRANULE % gran != 0)
        why = "the allocation granularity does not divide 2 MiB";
    else if (drv->cuMemAddressReserve(&base, 2 * fa_vm_zone_for(t), FA_VM_GRANULE, 0, 0) != 0)
        why = "no address space could be reserved";
    else if (!fa_vm_init(&d->vm, (uintptr_t)base, fa_vm_zone_for(t))) {
        drv->cuMemAddressFree(base, 2 * fa_vm_zone_for(t));
        why = "no memory for the pool's tables";
    }
    int rdma = 0; /* UCX and NCCL register pool memory for GPUDirect RDMA as they do cudaMalloc's */
    d->rdma = !why && drv->cuDeviceGetAttribute(&rdma, FA_CU_ATTR_GDR_VMM_SUPPORTED, dev) == 0 && rdma == 1;
    fa_err_absorb(rt, before);
    if (why) {
        fa_info("device %d: chunk pool, not physical pieces: %s", dev, why);
        return false;
    }
    bound_devices |= 1u << dev;
    fa_info("device %d: pool of 2 MiB physical pieces in %zu GiB of reserved address space", dev,
            (size_t)(d->vm.zone >> 29));
    return true;
}
