/* cudart.c - find the real CUDA runtime (see cudart.h). */
#define _GNU_SOURCE
#include "cudart.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#include "../core/log.h"

/* Written once, under the lock, before `found` publishes it; until then
 * callers get `none` (every function missing). */
static fa_cudart rt, none;
static int found; /* 1 once a runtime was found; until then every call looks again */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* dl_iterate_phdr callback: the first loaded libcudart*.so* that is not us. */
static int find_loaded(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    const char *name = info->dlpi_name;
    const char *base = name ? strrchr(name, '/') : NULL;
    base = base ? base + 1 : name;
    if (!base || strncmp(base, "libcudart", 9) != 0 || !strstr(base, ".so"))
        return 0;
    size_t n = strlen(name);
    if (n >= sizeof rt.path)
        return 0; /* data is a fa_cudart's path */
    memcpy(data, name, n + 1);
    return 1;
}

/* Look for the runtime into *r; true when found.  The loader's own lock is
 * taken inside (dlsym, dl_iterate_phdr, dlopen), so no lock of ours is held
 * here: a library constructor that calls cudaMalloc while the loader lock
 * is held must not wait on us while we wait on the loader. */
static bool resolve(fa_cudart *r)
{
    memset(r, 0, sizeof *r);
    /* Where does the next cudaMalloc after ours live? */
    void *next = dlsym(RTLD_NEXT, "cudaMalloc");
    Dl_info info;
    if (next && dladdr(next, &info) && info.dli_fname && strlen(info.dli_fname) < sizeof r->path)
        strcpy(r->path, info.dli_fname);
    else
        dl_iterate_phdr(find_loaded, r->path); /* loaded with RTLD_LOCAL */
    if (!r->path[0])
        return false;
    /* RTLD_NOLOAD: only a library that is already there; never load one. */
    void *h = dlopen(r->path, RTLD_LAZY | RTLD_NOLOAD);
    if (!h) {
        r->path[0] = '\0';
        return false;
    }
#define FA_CUDART_LOOKUP(name, ret, params, args) *(void **)&r->name = dlsym(h, #name);
    FA_CUDART_FUNCS(FA_CUDART_LOOKUP)
#undef FA_CUDART_LOOKUP
    /* The handle stays open: the runtime must outlive our use of it (two
     * threads racing here open it twice; the count only keeps it loaded). */
    return true;
}

const fa_cudart *fa_cudart_get(void)
{
    if (__atomic_load_n(&found, __ATOMIC_ACQUIRE))
        return &rt;
    fa_cudart mine;
    if (!resolve(&mine))
        return &none;
    pthread_mutex_lock(&lock); /* only around the copy: the first one wins */
    bool first = !found;
    if (first) {
        rt = mine;
        __atomic_store_n(&found, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&lock);
    if (first)
        fa_debug("CUDA runtime functions from %s", rt.path);
    return &rt;
}

void *fa_cudart_next(const char *name) { return dlsym(RTLD_NEXT, name); }

/* A fork while another thread copied: the child's lock starts free. */
void fa_cudart_fork_child(void) { pthread_mutex_init(&lock, NULL); }

/* ---- the thread's last error --------------------------------------------- */

fa_cuda_error fa_cudart_error_peek(const fa_cudart *r)
{
    return r->cudaPeekAtLastError ? r->cudaPeekAtLastError() : 0;
}

fa_cudart_mode fa_cudart_relax(const fa_cudart *r)
{
    fa_cudart_mode m = {FA_CUDA_CAPTURE_MODE_RELAXED, false};
    m.changed = r->cudaThreadExchangeStreamCaptureMode && r->cudaThreadExchangeStreamCaptureMode(&m.mode) == 0;
    return m;
}

void fa_cudart_unrelax(const fa_cudart *r, fa_cudart_mode m)
{
    if (m.changed)
        r->cudaThreadExchangeStreamCaptureMode(&m.mode);
}

/* The calls run in relaxed capture mode, where a cudaMalloc is neither
 * refused for a capture under way nor invalidates it. */
void fa_cudart_error_raise(const fa_cudart *r, fa_cuda_error e)
{
    if ((e != FA_CUDA_ERROR_INVALID_VALUE && e != FA_CUDA_ERROR_MEMORY_ALLOCATION &&
         e != FA_CUDA_ERROR_INVALID_DEVICE) ||
        !r->cudaMalloc || !r->cudaSetDevice)
        return;
    fa_cudart_mode m = fa_cudart_relax(r);
    void *p = NULL;
    if (e == FA_CUDA_ERROR_INVALID_VALUE)
        r->cudaMalloc(NULL, 1); /* no place for the pointer */
    else if (e == FA_CUDA_ERROR_MEMORY_ALLOCATION && r->cudaMalloc(&p, (size_t)-1) == 0 && r->cudaFree)
        r->cudaFree(p); /* more than any device has: never served */
    else if (e == FA_CUDA_ERROR_INVALID_DEVICE)
        r->cudaSetDevice(-1); /* no such device: the current one stays */
    fa_cudart_unrelax(r, m);
}

void fa_cudart_error_restore(const fa_cudart *r, fa_cuda_error before)
{
    if (!r->cudaPeekAtLastError || !r->cudaGetLastError || r->cudaPeekAtLastError() == before)
        return; /* nothing failed, or with the same (or a sticky) error */
    if (before == 0)
        r->cudaGetLastError();
    else
        fa_cudart_error_raise(r, before); /* where it cannot, the internal call's error stays pending instead */
}

/* ---- the driver's functions through the runtime ---------------------------- */

static fa_cudrv drv;
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;
static const fa_cudart *drv_rt, *drv_rt_arg;
static int drv_found;

static void *entry_point(const char *name)
{
    void *fn = NULL;
    fa_cuda_entry_status st = (fa_cuda_entry_status)1;
    if (drv_rt->cudaGetDriverEntryPointByVersion &&
        drv_rt->cudaGetDriverEntryPointByVersion(name, &fn, FA_CU_ENTRY_VERSION, FA_CUDA_ENABLE_DEFAULT, &st) == 0 &&
        st == FA_CUDA_ENTRY_POINT_SUCCESS && fn)
        return fn;
    fn = NULL;
    if (drv_rt->cudaGetDriverEntryPoint &&
        drv_rt->cudaGetDriverEntryPoint(name, &fn, FA_CUDA_ENABLE_DEFAULT, &st) == 0 &&
        st == FA_CUDA_ENTRY_POINT_SUCCESS && fn)
        return fn;
    return NULL;
}

static void resolve_driver(void)
{
    drv_rt = __atomic_load_n(&drv_rt_arg, __ATOMIC_ACQUIRE);
    fa_cuda_error before = fa_cudart_error_peek(drv_rt);
    int missing = 0;
#define FA_CUDRV_LOOKUP(name, params)                      \
    *(void **)&drv.name = entry_point(#name);              \
    missing += drv.name == NULL;
    FA_CU_FUNCS(FA_CUDRV_LOOKUP)
#undef FA_CUDRV_LOOKUP
    fa_cudart_error_restore(drv_rt, before); /* a failed lookup is ours, not the program's */
    if (missing)
        fa_debug("%d driver virtual-memory functions not found through the runtime", missing);
    __atomic_store_n(&drv_found, !missing, __ATOMIC_RELEASE);
}

const fa_cudrv *fa_cudrv_get(const fa_cudart *r)
{
    /* Every caller passes the same runtime.  Stored only while unset: a
     * store on every call would make threads on different devices fight
     * over this line on every cudaMalloc. */
    if (!__atomic_load_n(&drv_rt_arg, __ATOMIC_ACQUIRE))
        __atomic_store_n(&drv_rt_arg, r, __ATOMIC_RELEASE);
    pthread_once(&drv_once, resolve_driver);
    return __atomic_load_n(&drv_found, __ATOMIC_ACQUIRE) ? &drv : NULL;
}
