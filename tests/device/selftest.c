/* selftest.c - fakecuda_selftest: proves the stand-in runtime behaves as
 * fakecuda.h and the top of fakecudart.c say.  Linked to the stand-in, no
 * shim.  Device memory is host memory, so the checks read it directly.
 *
 * Prints nothing but a final count on success; the first failed check
 * prints where and why and exits 1.  It forks, and runs itself as a child
 * process (--child MODE) to check what depends on the environment at
 * start-up. */
#define _GNU_SOURCE
#include "fakecuda.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MiB ((size_t)1 << 20)
#define CAP0 (64 * MiB) /* FAKECUDA_MEM, set in main */
#define CAP1 (32 * MiB) /* FAKECUDA_MEM_1 */

static unsigned checks;

static void fail(const char *file, int line, const char *what, const char *fmt, ...)
    __attribute__((format(printf, 4, 5), noreturn));
static void fail(const char *file, int line, const char *what, const char *fmt, ...)
{
    fprintf(stderr, "%s:%d: check failed: %s\n    ", file, line, what);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

/* CHECK(condition, printf-style explanation) */
#define CHECK(cond, ...)                                       \
    do {                                                       \
        checks++;                                              \
        if (!(cond))                                           \
            fail(__FILE__, __LINE__, #cond, __VA_ARGS__);      \
    } while (0)

/* EXPECT(call, error code it must return) */
#define EXPECT(call, want)                                                                          \
    do {                                                                                            \
        int rc_ = (call);                                                                           \
        CHECK(rc_ == (want), "returned %d (%s), want %d (%s)", rc_, cudaGetErrorName(rc_), (want), \
              cudaGetErrorName(want));                                                              \
    } while (0)

#define OK(call) EXPECT(call, cudaSuccess)

/* Forget the last error after checking failures on purpose. */
#define CLEAR_ERROR() ((void)cudaGetLastError())

/* Does [p, p+n) hold only byte? */
static int all(const void *p, int byte, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        if (c[i] != (unsigned char)byte)
            return 0;
    return 1;
}

static size_t mem_free(void)
{
    size_t f, t;
    OK(cudaMemGetInfo(&f, &t));
    return f;
}

static size_t mem_total(void)
{
    size_t f, t;
    OK(cudaMemGetInfo(&f, &t));
    return t;
}

/* ---- ELF identity ---------------------------------------------------------------------- */

static void test_identity(void)
{
    void *h = dlopen("libcudart.so.13", RTLD_NOW | RTLD_NOLOAD);
    CHECK(h != NULL, "no library with SONAME libcudart.so.13 is loaded");
    CHECK(dlsym(h, "fakecuda_calls") != NULL, "the libcudart.so.13 loaded is not the stand-in");
#define X(name) \
    CHECK(dlvsym(h, #name, "libcudart.so.13") != NULL, "%s is not exported with version libcudart.so.13", #name);
    FAKECUDA_FUNCS(X)
#undef X
    CHECK(dlvsym(h, "fakecuda_enqueue_fill", "libcudart.so.13") != NULL, "hooks carry the version too");
    CHECK(dlvsym(h, "cudaMalloc", "libcudart.so.12") == NULL, "no other version node");
    CHECK(dlsym(h, "ensure_context") == NULL && dlsym(h, "g") == NULL, "internals are not exported");
    dlclose(h);
}

/* ---- devices, versions, errors ------------------------------------------------------------ */

static void test_devices_and_errors(void)
{
    int v = 0, n = 0, d = -1;
    OK(cudaRuntimeGetVersion(&v));
    CHECK(v == 13000, "runtime version %d", v);
    OK(cudaDriverGetVersion(&v));
    CHECK(v == 13000, "driver version %d", v);
    OK(cudaGetDeviceCount(&n));
    CHECK(n == 2, "FAKECUDA_DEVICES=2 gave %d devices", n);
    OK(cudaGetDevice(&d));
    CHECK(d == 0, "the current device starts at 0, got %d", d);

    /* Invalid ordinal; last error: peek keeps it, get returns and clears it,
     * successful calls leave it alone. */
    OK(cudaGetLastError());
    EXPECT(cudaSetDevice(2), cudaErrorInvalidDevice);
    EXPECT(cudaSetDevice(-1), cudaErrorInvalidDevice);
    OK(cudaGetDevice(&d));
    CHECK(d == 0, "a failed cudaSetDevice changed the device to %d", d);
    EXPECT(cudaPeekAtLastError(), cudaErrorInvalidDevice);
    EXPECT(cudaPeekAtLastError(), cudaErrorInvalidDevice);
    OK(cudaGetDeviceCount(&n));
    EXPECT(cudaGetLastError(), cudaErrorInvalidDevice);
    OK(cudaGetLastError());
    OK(cudaPeekAtLastError());
    EXPECT(cudaGetDevice(NULL), cudaErrorInvalidValue);
    EXPECT(cudaSetDevice(7), cudaErrorInvalidDevice);
    EXPECT(cudaGetLastError(), cudaErrorInvalidDevice); /* the latest error wins */
    OK(cudaSetDevice(1));
    OK(cudaGetDevice(&d));
    CHECK(d == 1, "cudaSetDevice(1) then cudaGetDevice gave %d", d);
    OK(cudaSetDevice(0));

    CHECK(strcmp(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory") == 0, "string for 2");
    CHECK(strcmp(cudaGetErrorString(cudaSuccess), "no error") == 0, "string for 0");
    CHECK(strcmp(cudaGetErrorName(cudaErrorStreamCaptureInvalidated), "cudaErrorStreamCaptureInvalidated") == 0,
          "name for 901");
    CHECK(strcmp(cudaGetErrorName(cudaErrorInvalidResourceHandle), "cudaErrorInvalidResourceHandle") == 0,
          "name for 400");
    CHECK(strcmp(cudaGetErrorString(12345), "unrecognized error code") == 0, "unknown code");
    OK(cudaGetLastError());
}

/* ---- capacity, placement, cudaFree --------------------------------------------------------- */

static void test_capacity(void)
{
    size_t f, t;
    OK(cudaMemGetInfo(&f, &t));
    CHECK(t == CAP0 && f == CAP0, "device 0: free %zu total %zu, want %zu both", f, t, CAP0);
    EXPECT(cudaMemGetInfo(NULL, &t), cudaErrorInvalidValue);
    OK(cudaSetDevice(1));
    CHECK(mem_total() == CAP1, "FAKECUDA_MEM_1 sets device 1's capacity");
    OK(cudaSetDevice(0));

    void *a, *b, *z = &z;
    OK(cudaMalloc(&a, 1));
    CHECK(((uintptr_t)a & 511) == 0, "cudaMalloc alignment: %p", a);
    CHECK(fakecuda_used(0) == 512 && mem_free() == CAP0 - 512, "1 byte takes 512: used %zu", fakecuda_used(0));
    OK(cudaMalloc(&b, 513));
    CHECK((char *)b == (char *)a + 512, "next allocation follows: %p %p", a, b);
    CHECK(fakecuda_used(0) == 1536, "513 bytes take 1024: used %zu", fakecuda_used(0));
    CHECK(mem_total() == CAP0 && mem_free() == CAP0 - 1536, "cudaMemGetInfo: total stays, free drops");
    OK(cudaMalloc(&z, 0));
    CHECK(z == NULL, "cudaMalloc of 0 bytes gives NULL");
    EXPECT(cudaMalloc(NULL, 16), cudaErrorInvalidValue);

    /* Out of memory: error, NULL, last error set. */
    EXPECT(cudaGetLastError(), cudaErrorInvalidValue);
    void *big = &big;
    EXPECT(cudaMalloc(&big, CAP0), cudaErrorMemoryAllocation);
    CHECK(big == NULL, "a failed cudaMalloc gives NULL");
    EXPECT(cudaGetLastError(), cudaErrorMemoryAllocation);
    OK(cudaMalloc(&big, CAP0 - 1536));
    CHECK(mem_free() == 0, "device full");
    EXPECT(cudaMalloc(&z, 1), cudaErrorMemoryAllocation);
    OK(cudaFree(big));
    OK(cudaFree(a));
    OK(cudaFree(b));
    CHECK(fakecuda_used(0) == 0 && mem_free() == CAP0, "all freed");
    EXPECT(cudaGetLastError(), cudaErrorMemoryAllocation);

    /* Device 1 is smaller. */
    OK(cudaSetDevice(1));
    EXPECT(cudaMalloc(&big, CAP1 + 1), cudaErrorMemoryAllocation);
    OK(cudaSetDevice(0));
    OK(cudaMalloc(&big, CAP1 + 1));
    OK(cudaFree(big));
    EXPECT(cudaGetLastError(), cudaErrorMemoryAllocation);
}

static void test_free_rules(void)
{
    void *a, *h;
    int local;
    OK(cudaFree(NULL));
    OK(cudaMalloc(&a, 4096));
    EXPECT(cudaFree((char *)a + 512), cudaErrorInvalidValue);
    EXPECT(cudaPeekAtLastError(), cudaErrorInvalidValue);
    EXPECT(cudaFree(&local), cudaErrorInvalidValue);
    OK(cudaMallocHost(&h, 100));
    EXPECT(cudaFree(h), cudaErrorInvalidValue);
    OK(cudaFreeHost(h));
    /* cudaFree works whatever the current device is */
    OK(cudaSetDevice(1));
    OK(cudaFree(a));
    OK(cudaSetDevice(0));
    EXPECT(cudaFree(a), cudaErrorInvalidValue); /* double free */
    EXPECT(cudaGetLastError(), cudaErrorInvalidValue);
    CHECK(fakecuda_used(0) == 0, "used %zu", fakecuda_used(0));
}

static void test_first_fit(void)
{
    void *a, *b, *c, *d, *e, *f;
    OK(cudaMalloc(&a, 4096));
    OK(cudaMalloc(&b, 4096));
    OK(cudaMalloc(&c, 4096));
    OK(cudaFree(b));
    OK(cudaMalloc(&d, 1000));
    CHECK(d == b, "a freed address is reused (first fit): got %p, freed %p", d, b);
    OK(cudaMalloc(&e, 8192));
    CHECK((char *)e == (char *)c + 4096, "too big for the hole, goes after c");
    OK(cudaMalloc(&f, 3000));
    CHECK((char *)f == (char *)b + 1024, "the rest of the hole is used next: %p", f);
    OK(cudaFree(a));
    OK(cudaFree(c));
    OK(cudaFree(d));
    OK(cudaFree(e));
    OK(cudaFree(f));
    OK(cudaMalloc(&a, 100));
    CHECK(a != NULL && fakecuda_device_of(a) == 0, "back to the start");
    OK(cudaFree(a));
}

static void test_two_devices(void)
{
    void *p0, *p1;
    OK(cudaSetDevice(1));
    OK(cudaMalloc(&p1, 4096));
    OK(cudaSetDevice(0));
    OK(cudaMalloc(&p0, 4096));
    CHECK(fakecuda_device_of(p1) == 1 && fakecuda_device_of(p0) == 0, "device_of");
    CHECK(fakecuda_device_of((char *)p1 + 4095) == 1, "device_of an interior pointer");
    CHECK(fakecuda_device_of((char *)p1 + 4096) == -1 && fakecuda_device_of(&p0) == -1, "device_of outside");
    uintptr_t lo = (uintptr_t)p0 < (uintptr_t)p1 ? (uintptr_t)p0 : (uintptr_t)p1;
    uintptr_t hi = (uintptr_t)p0 < (uintptr_t)p1 ? (uintptr_t)p1 : (uintptr_t)p0;
    CHECK(hi - lo >= CAP1, "device regions are distinct: %p %p", p0, p1);
    CHECK(fakecuda_used(0) == 4096 && fakecuda_used(1) == 4096, "per-device accounting");
    CHECK(mem_free() == CAP0 - 4096, "cudaMemGetInfo counts the current device only");
    OK(cudaFree(p1)); /* from device 0 */
    CHECK(fakecuda_used(1) == 0, "device 1 memory freed from device 0");
    OK(cudaFree(p0));
}

/* ---- queued work ---------------------------------------------------------------------------- */

static void test_queued_work(void)
{
    unsigned char *b, host[64];
    cudaStream_t s, ns, s1;
    cudaEvent_t e;
    OK(cudaMalloc((void **)&b, 4096));
    OK(cudaMemset(b, 0, 4096));
    OK(cudaStreamCreate(&s));
    OK(cudaStreamCreateWithFlags(&ns, cudaStreamNonBlocking));
    EXPECT(cudaStreamCreateWithFlags(&ns, 0x10), cudaErrorInvalidValue);
    OK(cudaEventCreate(&e));
    EXPECT(cudaGetLastError(), cudaErrorInvalidValue);

    /* cudaStreamSynchronize */
    OK(fakecuda_enqueue_fill(s, b, 0xAA, 4096));
    CHECK(all(b, 0, 4096), "queued fill not visible before a synchronisation");
    CHECK(fakecuda_pending(0) == 1, "pending %zu", fakecuda_pending(0));
    EXPECT(cudaStreamQuery(s), cudaErrorNotReady);
    OK(cudaPeekAtLastError()); /* not ready is not an error */
    OK(cudaStreamQuery(ns));
    CHECK(all(b, 0, 4096), "cudaStreamQuery lands nothing");
    OK(cudaStreamSynchronize(s));
    CHECK(all(b, 0xAA, 4096), "visible after cudaStreamSynchronize");
    CHECK(fakecuda_pending(0) == 0, "nothing pending");
    OK(cudaStreamQuery(s));

    /* cudaEventSynchronize lands up to the record only */
    OK(fakecuda_enqueue_fill(s, b, 1, 16));
    OK(cudaEventRecord(e, s));
    OK(fakecuda_enqueue_fill(s, b, 2, 16));
    OK(cudaEventSynchronize(e));
    CHECK(all(b, 1, 16), "the work before the record landed: %d", b[0]);
    CHECK(fakecuda_pending(0) == 1, "the work after the record did not");
    OK(cudaStreamSynchronize(s));
    CHECK(all(b, 2, 16), "then the rest");
    OK(cudaEventSynchronize(e)); /* already complete */

    /* cudaDeviceSynchronize lands every stream */
    OK(fakecuda_enqueue_fill(s, b, 3, 16));
    OK(fakecuda_enqueue_fill(NULL, b + 16, 4, 16));
    OK(fakecuda_enqueue_fill(ns, b + 32, 5, 16));
    OK(cudaDeviceSynchronize());
    CHECK(all(b, 3, 16) && all(b + 16, 4, 16) && all(b + 32, 5, 16), "cudaDeviceSynchronize");

    /* cudaFree lands the device's streams, then frees */
    void *tmp;
    OK(cudaMalloc(&tmp, 512));
    OK(fakecuda_enqueue_fill(ns, b, 6, 16));
    OK(fakecuda_enqueue_fill(s, b + 16, 7, 16));
    OK(cudaFree(tmp));
    CHECK(all(b, 6, 16) && all(b + 16, 7, 16), "cudaFree landed the queued work");
    OK(cudaFree(NULL));

    /* synchronous cudaMemcpy / cudaMemset land the device's streams first */
    OK(fakecuda_enqueue_fill(s, b, 8, 16));
    OK(cudaMemcpy(host, b, 16, cudaMemcpyDeviceToHost));
    CHECK(all(host, 8, 16), "cudaMemcpy copied after the queued fill");
    OK(fakecuda_enqueue_fill(ns, b, 9, 16));
    OK(cudaMemset(b, 10, 8));
    CHECK(all(b, 10, 8) && all(b + 8, 9, 8), "cudaMemset wrote after the queued fill");
    memset(host, 11, sizeof host);
    OK(cudaMemcpy(b, host, 64, cudaMemcpyHostToDevice));
    CHECK(all(b, 11, 64), "cudaMemcpy host to device");
    OK(cudaMemcpy(b + 64, b, 64, cudaMemcpyDeviceToDevice));
    OK(cudaMemcpy(b + 128, b, 64, cudaMemcpyDefault));
    CHECK(all(b + 64, 11, 64) && all(b + 128, 11, 64), "device to device, default");
    EXPECT(cudaMemcpy(host, host + 1, 16, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
    EXPECT(cudaMemcpy(b, host, 16, 9), cudaErrorInvalidValue);
    EXPECT(cudaMemset(host, 0, 16), cudaErrorInvalidValue);
    EXPECT(cudaGetLastError(), cudaErrorInvalidValue);

    /* cudaMemsetAsync / cudaMemcpyAsync queue */
    OK(cudaMemsetAsync(b, 12, 16, s));
    memset(host, 0, sizeof host);
    OK(cudaMemcpyAsync(host, b, 16, cudaMemcpyDeviceToHost, s));
    CHECK(all(b, 11, 16) && all(host, 0, 16), "async memset and copy queued");
    OK(cudaStreamSynchronize(s));
    CHECK(all(b, 12, 16) && all(host, 12, 16), "async memset then copy landed in order");
    EXPECT(cudaMemsetAsync(host, 0, 16, s), cudaErrorInvalidValue);
    EXPECT(cudaGetLastError(), cudaErrorInvalidValue);

    /* the legacy stream: NULL, cudaStreamLegacy, cudaStreamPerThread; _ptsz */
    OK(cudaMemsetAsync(b, 13, 16, cudaStreamLegacy));
    OK(cudaMemsetAsync(b + 16, 14, 16, NULL));
    EXPECT(cudaStreamQuery(NULL), cudaErrorNotReady);
    OK(cudaStreamSynchronize_ptsz(NULL));
    CHECK(all(b, 13, 16) && all(b + 16, 14, 16), "cudaStreamSynchronize_ptsz(NULL)");

    /* implicit ordering: blocking streams wait for earlier legacy work and
     * the other way round; non-blocking streams wait for nothing */
    OK(fakecuda_enqueue_fill(NULL, b, 15, 16));
    OK(fakecuda_enqueue_fill(s, b, 16, 16));
    OK(cudaStreamSynchronize(s));
    CHECK(all(b, 16, 16) && fakecuda_pending(0) == 0, "legacy work landed first, then the blocking stream's");
    OK(fakecuda_enqueue_fill(s, b, 17, 16));
    OK(fakecuda_enqueue_fill(NULL, b, 18, 16));
    OK(cudaStreamSynchronize(NULL));
    CHECK(all(b, 18, 16) && fakecuda_pending(0) == 0, "blocking work landed before the legacy stream's");
    OK(fakecuda_enqueue_fill(NULL, b, 19, 16));
    OK(fakecuda_enqueue_fill(ns, b + 16, 20, 16));
    OK(cudaStreamSynchronize(ns));
    CHECK(all(b, 18, 16) && all(b + 16, 20, 16), "a non-blocking stream does not wait for the legacy stream");
    CHECK(fakecuda_pending(0) == 1, "the legacy fill is still queued");
    OK(cudaDeviceSynchronize());

    /* cudaFreeAsync queues the free; cudaMallocAsync allocates at once */
    void *x, *y;
    OK(cudaMalloc(&x, 4096));
    size_t used = fakecuda_used(0);
    OK(cudaFreeAsync(x, s));
    CHECK(fakecuda_used(0) == used && fakecuda_pending(0) == 1, "the free is queued");
    EXPECT(cudaFree(x), cudaErrorInvalidValue);     /* already being freed */
    EXPECT(cudaFreeAsync(x, s), cudaErrorInvalidValue);
    OK(cudaStreamSynchronize(s));
    CHECK(fakecuda_used(0) == used - 4096, "the free landed");
    OK(cudaFreeAsync(NULL, s));
    OK(cudaMallocAsync(&y, 1000, s));
    CHECK(y && fakecuda_used(0) == used - 4096 + 1024 && fakecuda_pending(0) == 0, "cudaMallocAsync is immediate");
    OK(fakecuda_enqueue_fill(s, b, 21, 16));
    OK(cudaFree(y)); /* memory from cudaMallocAsync: cudaFree does not synchronise */
    CHECK(all(b, 19, 16) && fakecuda_pending(0) == 1, "cudaFree of cudaMallocAsync memory did not land work");
    OK(cudaMallocAsync_ptsz(&y, 512, NULL));
    OK(cudaFreeAsync_ptsz(y, NULL));
    OK(cudaDeviceSynchronize());
    CHECK(all(b, 21, 16) && fakecuda_used(0) == used - 4096, "_ptsz variants");
    EXPECT(cudaGetLastError(), cudaErrorInvalidValue);

    /* the fill hook's checks */
    int local;
    EXPECT(fakecuda_enqueue_fill(s, &local, 0, sizeof local), cudaErrorInvalidValue);
    EXPECT(cudaGetLastError(), cudaErrorInvalidValue);
    EXPECT(fakecuda_enqueue_fill((cudaStream_t)&local, b, 0, 1), cudaErrorInvalidResourceHandle);
    OK(fakecuda_enqueue_fill(s, &local, 0, 0));

    /* a device's work lands with that device: cudaFree of device 1 memory
     * lands device 1's streams, not device 0's */
    void *p1;
    OK(cudaSetDevice(1));
    OK(cudaStreamCreate(&s1));
    OK(cudaMalloc(&p1, 4096));
    OK(cudaMalloc(&y, 512));
    EXPECT(fakecuda_enqueue_fill(s1, b, 0, 16), cudaErrorInvalidValue); /* device 0 memory */
    OK(fakecuda_enqueue_fill(s1, p1, 22, 4096));
    OK(cudaSetDevice(0));
    OK(fakecuda_enqueue_fill(s, b, 23, 16));
    OK(cudaFree(y));
    CHECK(all(p1, 22, 4096) && fakecuda_pending(1) == 0, "device 1 work landed");
    CHECK(all(b, 21, 16) && fakecuda_pending(0) == 1, "device 0 work did not");
    OK(fakecuda_enqueue_fill(s1, p1, 24, 16));
    OK(cudaDeviceSynchronize());
    CHECK(!all(p1, 24, 16), "cudaDeviceSynchronize covers the current device only");
    EXPECT(cudaEventRecord(e, s1), cudaErrorInvalidResourceHandle); /* event of device 0 */
    EXPECT(cudaGetLastError(), cudaErrorInvalidResourceHandle);

    /* destroying a stream lets its work complete; its handle is gone */
    OK(cudaStreamDestroy(s1));
    CHECK(all(p1, 24, 16) && fakecuda_pending(1) == 0, "work of a destroyed stream landed");
    EXPECT(cudaStreamSynchronize(s1), cudaErrorInvalidResourceHandle);
    EXPECT(cudaStreamDestroy(NULL), cudaErrorInvalidResourceHandle);
    OK(cudaFree(p1));

    /* events: records on a destroyed stream are complete; bad handles */
    cudaStream_t tmp_s;
    OK(cudaStreamCreate(&tmp_s));
    OK(fakecuda_enqueue_fill(tmp_s, b, 25, 16));
    OK(cudaEventRecord(e, tmp_s));
    OK(cudaStreamDestroy(tmp_s));
    OK(cudaEventSynchronize(e));
    CHECK(all(b, 25, 16), "landed");
    OK(cudaEventDestroy(e));
    EXPECT(cudaEventSynchronize(e), cudaErrorInvalidResourceHandle);
    EXPECT(cudaEventDestroy(NULL), cudaErrorInvalidResourceHandle);
    EXPECT(cudaEventCreate(NULL), cudaErrorInvalidValue);
    EXPECT(cudaGetLastError(), cudaErrorInvalidValue);

    OK(cudaStreamDestroy(s));
    OK(cudaStreamDestroy(ns));
    OK(cudaFree(b));
    CHECK(fakecuda_used(0) == 0 && fakecuda_used(1) == 0, "all freed");
}

/* ---- cudaDeviceReset ------------------------------------------------------------------------ */

static void test_reset(void)
{
    void *keep, *x, *y;
    cudaStream_t s1;
    cudaEvent_t e1;
    OK(cudaMalloc(&keep, 4096));
    OK(fakecuda_enqueue_fill(NULL, keep, 1, 16));
    OK(cudaSetDevice(1));
    OK(cudaMalloc(&x, 4096));
    OK(cudaMemset(x, 7, 4096));
    OK(cudaStreamCreate(&s1));
    int d = -1;
    OK(cudaSetDevice(0));
    OK(cudaStreamGetDevice(s1, &d)); /* whichever device is current */
    CHECK(d == 1, "the stream's device: %d", d);
    OK(cudaStreamGetDevice(NULL, &d));
    CHECK(d == 0, "the legacy stream's device is the current one: %d", d);
    EXPECT(cudaStreamGetDevice(s1, NULL), cudaErrorInvalidValue);
    OK(cudaSetDevice(1));
    OK(cudaEventCreate(&e1));
    OK(fakecuda_enqueue_fill(s1, x, 2, 16));
    OK(fakecuda_enqueue_fill(NULL, x, 3, 16));
    unsigned long stale = fakecuda_stale_stream_uses();
    OK(cudaDeviceReset());
    CHECK(fakecuda_used(1) == 0 && fakecuda_pending(1) == 0, "device 1 emptied");
    CHECK(all(x, 0, 4096), "queued work dropped, memory reads as zero");
    CHECK(fakecuda_stale_stream_uses() == stale, "no stale use yet");
    EXPECT(cudaStreamSynchronize(s1), cudaErrorInvalidResourceHandle);
    EXPECT(cudaStreamGetDevice(s1, &d), cudaErrorInvalidResourceHandle);
    CHECK(fakecuda_stale_stream_uses() == stale + 2, "uses of a stream the reset destroyed are counted");
    EXPECT(cudaEventSynchronize(e1), cudaErrorInvalidResourceHandle);
    EXPECT(cudaFree(x), cudaErrorInvalidValue);
    EXPECT(cudaGetLastError(), cudaErrorInvalidValue);
    OK(cudaMalloc(&y, 100));
    CHECK(y == x, "the device starts over at the same place");
    OK(cudaFree(y));
    OK(cudaSetDevice(0));
    CHECK(fakecuda_used(0) == 4096 && fakecuda_pending(0) == 1, "device 0 untouched");
    OK(cudaFree(keep));
}

/* ---- stream capture -------------------------------------------------------------------------- */

struct thread_malloc {
    int mode; /* capture-interaction mode to use */
    int rc;
    void *p;
};

static void *malloc_in_thread(void *arg)
{
    struct thread_malloc *t = arg;
    int mode = t->mode;
    cudaThreadExchangeStreamCaptureMode(&mode);
    t->rc = cudaMalloc(&t->p, 512);
    return NULL;
}

/* cudaMalloc from a new thread in the given mode; what it allocated is put
 * on a list freed after the capture (cudaFree would be illegal during it). */
static void *thread_allocs[8];
static int n_thread_allocs;

static int malloc_from_thread(int mode)
{
    struct thread_malloc t = {mode, -1, NULL};
    pthread_t th;
    pthread_create(&th, NULL, malloc_in_thread, &t);
    pthread_join(th, NULL);
    if (t.p)
        thread_allocs[n_thread_allocs++] = t.p;
    return t.rc;
}

/* cudaFree(NULL) from a new thread in the given mode. */
static void *free_null_in_thread(void *arg)
{
    struct thread_malloc *t = arg;
    int mode = t->mode;
    cudaThreadExchangeStreamCaptureMode(&mode);
    t->rc = cudaFree(NULL);
    return NULL;
}

static int free_null_from_thread(int mode)
{
    struct thread_malloc t = {mode, -1, NULL};
    pthread_t th;
    pthread_create(&th, NULL, free_null_in_thread, &t);
    pthread_join(th, NULL);
    return t.rc;
}

static void free_thread_allocs(void)
{
    while (n_thread_allocs)
        OK(cudaFree(thread_allocs[--n_thread_allocs]));
}

static int capture_status(cudaStream_t s)
{
    int st = -1;
    OK(cudaStreamIsCapturing(s, &st));
    return st;
}

static void test_capture(void)
{
    cudaStream_t s, s2;
    cudaEvent_t e;
    cudaGraph_t gr;
    void *p, *q;
    unsigned char *b;
    OK(cudaStreamCreate(&s));
    OK(cudaStreamCreate(&s2));
    OK(cudaEventCreate(&e));
    OK(cudaMalloc((void **)&b, 4096));
    OK(cudaMemset(b, 0, 4096));

    EXPECT(cudaStreamBeginCapture(NULL, cudaStreamCaptureModeGlobal), cudaErrorStreamCaptureUnsupported);
    EXPECT(cudaStreamBeginCapture(s, 7), cudaErrorInvalidValue);
    EXPECT(cudaStreamEndCapture(s, &gr), cudaErrorIllegalState);
    CHECK(capture_status(s) == cudaStreamCaptureStatusNone, "not capturing");
    EXPECT(cudaGetLastError(), cudaErrorIllegalState);

    /* a clean capture: work is recorded, never lands */
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(capture_status(s) == cudaStreamCaptureStatusActive, "capturing");
    CHECK(capture_status(s2) == cudaStreamCaptureStatusNone && capture_status(NULL) == cudaStreamCaptureStatusNone,
          "other streams are not");
    EXPECT(cudaFreeAsync(b, s), cudaErrorInvalidValue); /* a free node needs a graph allocation */
    CHECK(fakecuda_device_of(b) == 0, "the refused free freed nothing");
    EXPECT(cudaGetLastError(), cudaErrorInvalidValue);
    EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaErrorIllegalState);
    OK(fakecuda_enqueue_fill(s, b, 1, 16));
    OK(cudaMemsetAsync(b, 2, 16, s));
    OK(cudaEventRecord(e, s));
    OK(cudaMallocAsync(&q, 512, s)); /* stream-ordered allocation is legal */
    OK(cudaFreeAsync(q, s));
    CHECK(fakecuda_pending(0) == 0, "captured work is not queued");
    gr = NULL;
    OK(cudaStreamEndCapture(s, &gr));
    CHECK(gr != NULL, "EndCapture gives a graph");
    CHECK(capture_status(s) == cudaStreamCaptureStatusNone, "capture over");
    OK(cudaStreamSynchronize(s));
    OK(cudaEventSynchronize(e));
    CHECK(all(b, 0, 16), "captured work never ran");
    OK(cudaFree(q)); /* the captured free never happened either */

    /* cudaMalloc in global mode invalidates */
    EXPECT(cudaGetLastError(), cudaErrorIllegalState);
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    p = &p;
    EXPECT(cudaMalloc(&p, 512), cudaErrorStreamCaptureUnsupported);
    CHECK(p == NULL, "no memory");
    EXPECT(cudaPeekAtLastError(), cudaErrorStreamCaptureUnsupported);
    CHECK(capture_status(s) == cudaStreamCaptureStatusInvalidated, "invalidated");
    EXPECT(cudaMemsetAsync(b, 3, 16, s), cudaErrorStreamCaptureInvalidated);
    EXPECT(fakecuda_enqueue_fill(s, b, 3, 16), cudaErrorStreamCaptureInvalidated);
    EXPECT(cudaMallocPitch(&p, &(size_t){0}, 10, 10), cudaErrorStreamCaptureUnsupported);
    EXPECT(cudaMalloc(NULL, 512), cudaErrorStreamCaptureUnsupported); /* the capture rule before the arguments */
    gr = (cudaGraph_t)&gr;
    EXPECT(cudaStreamEndCapture(s, &gr), cudaErrorStreamCaptureInvalidated);
    CHECK(gr == NULL, "no graph from an invalidated capture");
    CHECK(capture_status(s) == cudaStreamCaptureStatusNone, "ended");
    EXPECT(cudaGetLastError(), cudaErrorStreamCaptureInvalidated);
    OK(cudaMalloc(&p, 512));
    OK(cudaFree(p));

    /* relaxed mode allows cudaMalloc */
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    int mode = cudaStreamCaptureModeRelaxed;
    OK(cudaThreadExchangeStreamCaptureMode(&mode));
    CHECK(mode == cudaStreamCaptureModeGlobal, "the default mode is global: %d", mode);
    OK(cudaMalloc(&p, 512));
    OK(cudaThreadExchangeStreamCaptureMode(&mode));
    CHECK(mode == cudaStreamCaptureModeRelaxed, "the previous mode comes back");
    EXPECT(cudaThreadExchangeStreamCaptureMode(&(int){5}), cudaErrorInvalidValue);
    OK(cudaStreamEndCapture(s, &gr));
    EXPECT(cudaGetLastError(), cudaErrorInvalidValue);

    /* so does a capture begun in relaxed mode, for its own thread */
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    OK(cudaMalloc(&q, 512));
    OK(cudaStreamEndCapture(s, &gr));
    OK(cudaFree(q));

    /* other threads: a global capture forbids their cudaMalloc in global
     * mode, not in thread-local or relaxed mode */
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(malloc_from_thread(cudaStreamCaptureModeThreadLocal) == cudaSuccess, "thread-local mode thread");
    CHECK(malloc_from_thread(cudaStreamCaptureModeRelaxed) == cudaSuccess, "relaxed mode thread");
    CHECK(capture_status(s) == cudaStreamCaptureStatusActive, "still fine");
    CHECK(malloc_from_thread(cudaStreamCaptureModeGlobal) == cudaErrorStreamCaptureUnsupported, "global thread");
    CHECK(capture_status(s) == cudaStreamCaptureStatusInvalidated, "invalidated from another thread");
    EXPECT(cudaStreamEndCapture(s, &gr), cudaErrorStreamCaptureInvalidated);
    /* a thread-local capture does not concern other threads */
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    CHECK(malloc_from_thread(cudaStreamCaptureModeGlobal) == cudaSuccess, "thread-local capture elsewhere");
    EXPECT(cudaMalloc(&q, 512), cudaErrorStreamCaptureUnsupported);
    EXPECT(cudaStreamEndCapture(s, &gr), cudaErrorStreamCaptureInvalidated);
    CHECK(n_thread_allocs == 3, "three threads allocated");
    free_thread_allocs();
    CLEAR_ERROR();

    /* cudaFree, NULL included, follows the same rules: refused where the
     * mode prohibits it (nothing freed, the captures invalidated), allowed
     * in relaxed mode, where it lands the device's queued work and frees */
    void *f;
    OK(cudaMalloc(&f, 512));
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    EXPECT(cudaFree(f), cudaErrorStreamCaptureUnsupported);
    CHECK(fakecuda_device_of(f) == 0, "the refused cudaFree freed nothing");
    CHECK(capture_status(s) == cudaStreamCaptureStatusInvalidated, "a refused cudaFree invalidates");
    EXPECT(cudaFree(NULL), cudaErrorStreamCaptureUnsupported); /* until the invalidated capture ends */
    EXPECT(cudaStreamEndCapture(s, &gr), cudaErrorStreamCaptureInvalidated);
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    EXPECT(cudaFree(NULL), cudaErrorStreamCaptureUnsupported);
    EXPECT(cudaStreamEndCapture(s, &gr), cudaErrorStreamCaptureInvalidated);
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(free_null_from_thread(cudaStreamCaptureModeThreadLocal) == cudaSuccess, "thread-local mode thread");
    CHECK(capture_status(s) == cudaStreamCaptureStatusActive, "still fine");
    CHECK(free_null_from_thread(cudaStreamCaptureModeGlobal) == cudaErrorStreamCaptureUnsupported, "global thread");
    CHECK(capture_status(s) == cudaStreamCaptureStatusInvalidated, "invalidated from another thread");
    EXPECT(cudaStreamEndCapture(s, &gr), cudaErrorStreamCaptureInvalidated);
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    mode = cudaStreamCaptureModeRelaxed;
    OK(cudaThreadExchangeStreamCaptureMode(&mode));
    OK(fakecuda_enqueue_fill(s2, b, 4, 16));
    OK(fakecuda_enqueue_fill(s, b, 5, 16)); /* captured */
    OK(cudaFree(f));
    CHECK(fakecuda_device_of(f) == -1, "freed in relaxed mode");
    CHECK(all(b, 4, 16) && fakecuda_pending(0) == 0, "cudaFree landed the queued work, not the captured");
    OK(cudaFree(NULL));
    OK(cudaThreadExchangeStreamCaptureMode(&mode));
    CHECK(capture_status(s) == cudaStreamCaptureStatusActive, "not invalidated");
    OK(cudaStreamEndCapture(s, &gr));
    CLEAR_ERROR();

    /* every synchronising call is illegal during a capture and invalidates
     * all captures, whichever stream it concerns */
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    OK(cudaStreamBeginCapture(s2, cudaStreamCaptureModeGlobal));
    EXPECT(cudaDeviceSynchronize(), cudaErrorStreamCaptureUnsupported);
    CHECK(capture_status(s) == cudaStreamCaptureStatusInvalidated &&
              capture_status(s2) == cudaStreamCaptureStatusInvalidated,
          "both captures invalidated");
    EXPECT(cudaStreamEndCapture(s, &gr), cudaErrorStreamCaptureInvalidated);
    EXPECT(cudaStreamEndCapture(s2, &gr), cudaErrorStreamCaptureInvalidated);

#define ILLEGAL_DURING_CAPTURE(call)                                                 \
    do {                                                                             \
        OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));                  \
        EXPECT(call, cudaErrorStreamCaptureUnsupported);                             \
        CHECK(capture_status(s) == cudaStreamCaptureStatusInvalidated, "%s", #call); \
        EXPECT(cudaStreamEndCapture(s, &gr), cudaErrorStreamCaptureInvalidated);     \
    } while (0)
    unsigned char host[16];
    void *h;
    OK(cudaMallocHost(&h, 64));
    ILLEGAL_DURING_CAPTURE(cudaStreamSynchronize(s2));
    ILLEGAL_DURING_CAPTURE(cudaStreamSynchronize(NULL));
    ILLEGAL_DURING_CAPTURE(cudaStreamSynchronize_ptsz(s2));
    ILLEGAL_DURING_CAPTURE(cudaEventSynchronize(e));
    ILLEGAL_DURING_CAPTURE(cudaMemcpy(host, b, 16, cudaMemcpyDeviceToHost));
    ILLEGAL_DURING_CAPTURE(cudaMemset(b, 0, 16));
    ILLEGAL_DURING_CAPTURE(cudaFree(p)); /* the unsafe-call rule, in global mode */
    ILLEGAL_DURING_CAPTURE(cudaFree(host)); /* any pointer */
    ILLEGAL_DURING_CAPTURE(cudaFreeHost(h));
    ILLEGAL_DURING_CAPTURE(cudaStreamQuery(s));
    CHECK(fakecuda_device_of(p) == 0, "the refused cudaFree freed nothing");
    OK(cudaFree(p));
    OK(cudaFreeHost(h));
    EXPECT(cudaGetLastError(), cudaErrorStreamCaptureInvalidated);

    /* Waiting for or asking about other streams and events, and
     * cudaMallocAsync on a stream not being captured, are potentially
     * unsafe calls, as on an H200 with CUDA 13.0: refused in global mode
     * on the capturing thread, fine in relaxed mode and on another thread
     * during a thread-local capture. */
    ILLEGAL_DURING_CAPTURE(cudaStreamQuery(s2));
    ILLEGAL_DURING_CAPTURE(cudaEventQuery(e));
    ILLEGAL_DURING_CAPTURE(cudaMallocAsync(&q, 512, s2));
    OK(fakecuda_enqueue_fill(s2, b, 6, 16));
    OK(cudaEventRecord(e, s2));
    OK(fakecuda_enqueue_fill(s2, b, 7, 16));
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    mode = cudaStreamCaptureModeRelaxed;
    OK(cudaThreadExchangeStreamCaptureMode(&mode));
    EXPECT(cudaEventQuery(e), cudaErrorNotReady); /* its record has not landed */
    EXPECT(cudaStreamQuery(s2), cudaErrorNotReady);
    OK(cudaEventSynchronize(e));
    CHECK(all(b, 6, 16), "the event's work landed");
    OK(cudaEventQuery(e));
    EXPECT(cudaStreamQuery(s2), cudaErrorNotReady); /* the second fill */
    OK(cudaStreamSynchronize(s2));
    CHECK(all(b, 7, 16), "the stream's work landed");
    OK(cudaStreamQuery(s2));
    OK(cudaMallocAsync(&q, 512, s2));
    OK(cudaFreeAsync(q, s2));
    OK(cudaThreadExchangeStreamCaptureMode(&mode));
    CHECK(capture_status(s) == cudaStreamCaptureStatusActive, "relaxed-mode calls leave the capture");
    OK(cudaStreamEndCapture(s, &gr));
    OK(cudaStreamSynchronize(s2));

    /* Work on the legacy stream while a blocking stream of its device is
     * captured: refused with cudaErrorStreamCaptureImplicit, the capture
     * invalidated, in every mode; not with a non-blocking stream captured,
     * nor on the per-thread stream. */
    cudaStream_t nb;
    OK(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    EXPECT(cudaEventRecord(e, NULL), cudaErrorStreamCaptureImplicit);
    CHECK(capture_status(s) == cudaStreamCaptureStatusInvalidated, "an implicit dependency invalidates");
    EXPECT(cudaStreamEndCapture(s, &gr), cudaErrorStreamCaptureInvalidated);
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    OK(cudaEventRecord(e, cudaStreamPerThread));
    CHECK(capture_status(s) == cudaStreamCaptureStatusActive, "the per-thread stream is not the legacy one");
    OK(cudaStreamEndCapture(s, &gr));
    OK(cudaStreamBeginCapture(nb, cudaStreamCaptureModeGlobal));
    OK(cudaEventRecord(e, NULL));
    OK(cudaMemsetAsync(b, 0, 16, cudaStreamLegacy));
    CHECK(capture_status(nb) == cudaStreamCaptureStatusActive, "no implicit dependency on a non-blocking stream");
    OK(cudaStreamEndCapture(nb, &gr));
    OK(cudaStreamDestroy(nb));
    OK(cudaDeviceSynchronize());
    CLEAR_ERROR();

    /* capture into an existing graph; the _ptsz entry points */
    cudaGraph_t mine = (cudaGraph_t)(void *)&mine;
    OK(cudaStreamBeginCaptureToGraph(s, mine, NULL, NULL, 0, cudaStreamCaptureModeGlobal));
    CHECK(capture_status(s) == cudaStreamCaptureStatusActive, "ToGraph captures");
    EXPECT(cudaMalloc(&q, 512), cudaErrorStreamCaptureUnsupported);
    EXPECT(cudaStreamEndCapture_ptsz(s, &gr), cudaErrorStreamCaptureInvalidated);
    OK(cudaStreamBeginCaptureToGraph_ptsz(s, mine, NULL, NULL, 0, cudaStreamCaptureModeGlobal));
    OK(cudaStreamEndCapture(s, &gr));
    CHECK(gr == mine, "EndCapture gives back the graph captured into");
    EXPECT(cudaStreamBeginCaptureToGraph(s, NULL, NULL, NULL, 0, 0), cudaErrorInvalidValue);
    OK(cudaStreamBeginCapture_ptsz(s, cudaStreamCaptureModeGlobal));
    OK(cudaStreamEndCapture_ptsz(s, &gr));
    CHECK(gr != NULL && gr != mine, "a graph of its own");

    /* destroying a capturing stream ends the capture; its handle is never
     * reused, and using it is counted */
    OK(cudaStreamBeginCapture(s2, cudaStreamCaptureModeGlobal));
    OK(cudaStreamDestroy(s2));
    OK(cudaDeviceSynchronize());
    EXPECT(cudaGetLastError(), cudaErrorInvalidValue);
    unsigned long stale = fakecuda_stale_stream_uses();
    EXPECT(cudaStreamIsCapturing(s2, &(int){0}), cudaErrorInvalidResourceHandle);
    CHECK(fakecuda_stale_stream_uses() == stale + 1, "a destroyed stream's use is counted");
    cudaStream_t s3;
    OK(cudaStreamCreate(&s3));
    CHECK(s3 != s2, "a new stream never gets a destroyed one's handle");
    EXPECT(cudaStreamIsCapturing((cudaStream_t)(uintptr_t)0xdead000, &(int){0}), cudaErrorInvalidResourceHandle);
    CHECK(fakecuda_stale_stream_uses() == stale + 1, "a bogus handle is not a destroyed stream's");
    OK(cudaStreamDestroy(s3));
    CLEAR_ERROR();

    OK(cudaEventDestroy(e));
    OK(cudaStreamDestroy(s));
    OK(cudaFree(b));
}

/* ---- pointer attributes, IPC, pitch, host memory ---------------------------------------------- */

static void test_pointer_attributes(void)
{
    struct cudaPointerAttributes at;
    void *d0, *d1, *h, *hm, *m, *z = &z;
    int local;
    OK(cudaMalloc(&d0, 4096));
    OK(cudaSetDevice(1));
    OK(cudaMalloc(&d1, 4096));
    OK(cudaMallocHost(&h, 100));
    OK(cudaSetDevice(0));
    OK(cudaHostAlloc(&hm, 5000, cudaHostAllocMapped | cudaHostAllocPortable));
    OK(cudaMallocManaged(&m, 100, cudaMemAttachGlobal));
    CHECK(fakecuda_used(0) == 4096 && fakecuda_used(1) == 4096, "host and managed memory are not device memory");
    memset(h, 1, 100);
    memset(hm, 2, 5000);
    memset(m, 3, 100);

    OK(cudaPointerGetAttributes(&at, (char *)d0 + 100));
    CHECK(at.type == cudaMemoryTypeDevice && at.device == 0 && at.devicePointer == (char *)d0 + 100 &&
              at.hostPointer == NULL,
          "device memory, interior pointer: type %d device %d", at.type, at.device);
    OK(cudaPointerGetAttributes(&at, d1));
    CHECK(at.type == cudaMemoryTypeDevice && at.device == 1, "device 1 memory: type %d device %d", at.type,
          at.device);
    OK(cudaPointerGetAttributes(&at, (char *)h + 99));
    CHECK(at.type == cudaMemoryTypeHost && at.device == 1 && at.hostPointer == (char *)h + 99, "pinned: %d",
          at.type);
    OK(cudaPointerGetAttributes(&at, hm));
    CHECK(at.type == cudaMemoryTypeHost && at.device == 0, "cudaHostAlloc: %d", at.type);
    OK(cudaPointerGetAttributes(&at, m));
    CHECK(at.type == cudaMemoryTypeManaged && at.devicePointer == m && at.hostPointer == m, "managed: %d", at.type);
    OK(cudaPointerGetAttributes(&at, &local));
    CHECK(at.type == cudaMemoryTypeUnregistered && at.device == cudaInvalidDeviceId && at.devicePointer == NULL,
          "unregistered: %d", at.type);
    EXPECT(cudaPointerGetAttributes(NULL, d0), cudaErrorInvalidValue);

    EXPECT(cudaHostAlloc(&z, 100, 0x80), cudaErrorInvalidValue);
    EXPECT(cudaMallocManaged(&z, 0, cudaMemAttachGlobal), cudaErrorInvalidValue);
    EXPECT(cudaMallocManaged(&z, 100, 0), cudaErrorInvalidValue);
    OK(cudaMallocHost(&z, 0));
    CHECK(z == NULL, "cudaMallocHost of 0 bytes gives NULL");
    EXPECT(cudaFreeHost((char *)h + 1), cudaErrorInvalidValue);
    EXPECT(cudaFreeHost(d0), cudaErrorInvalidValue);
    EXPECT(cudaFreeHost(m), cudaErrorInvalidValue);
    OK(cudaFreeHost(NULL));
    EXPECT(cudaGetLastError(), cudaErrorInvalidValue);

    OK(cudaFreeHost(h));
    OK(cudaFreeHost(hm));
    EXPECT(cudaFreeHost(h), cudaErrorInvalidValue);
    OK(cudaFree(m)); /* managed memory is freed with cudaFree */
    OK(cudaFree(d1));
    OK(cudaPointerGetAttributes(&at, d1));
    CHECK(at.type == cudaMemoryTypeUnregistered, "freed memory is unregistered");
    OK(cudaFree(d0));
    EXPECT(cudaGetLastError(), cudaErrorInvalidValue);
}

static void test_ipc(void)
{
    void *p, *q, *h;
    cudaIpcMemHandle_t a, b;
    struct fakecuda_ipc_payload pl;
    OK(cudaMalloc(&p, 4096));
    OK(cudaSetDevice(1));
    OK(cudaMalloc(&q, 4096));
    OK(cudaSetDevice(0));
    OK(cudaMallocHost(&h, 64));

    OK(cudaIpcGetMemHandle(&a, p));
    OK(cudaIpcGetMemHandle(&b, p));
    CHECK(memcmp(&a, &b, sizeof a) == 0, "same allocation, same handle");
    memcpy(&pl, a.reserved, sizeof pl);
    CHECK(memcmp(pl.magic, "fakecuda", 8) == 0 && pl.device == 0 && pl.base == (uintptr_t)p,
          "the handle names device 0 and the base");
    OK(cudaIpcGetMemHandle(&b, q)); /* from device 0 */
    memcpy(&pl, b.reserved, sizeof pl);
    CHECK(pl.device == 1 && pl.base == (uintptr_t)q, "device 1 allocation");
    CHECK(memcmp(&a, &b, sizeof a) != 0, "different allocations, different handles");

    EXPECT(cudaIpcGetMemHandle(&a, (char *)p + 512), cudaErrorInvalidValue);
    EXPECT(cudaIpcGetMemHandle(&a, h), cudaErrorInvalidValue);
    EXPECT(cudaIpcGetMemHandle(NULL, p), cudaErrorInvalidValue);
    EXPECT(cudaIpcGetMemHandle(&a, NULL), cudaErrorInvalidValue);
    OK(cudaFreeAsync(q, NULL));
    EXPECT(cudaIpcGetMemHandle(&a, q), cudaErrorInvalidValue); /* being freed */
    OK(cudaSetDevice(1));
    OK(cudaDeviceSynchronize());
    OK(cudaSetDevice(0));
    OK(cudaFree(p));
    EXPECT(cudaIpcGetMemHandle(&a, p), cudaErrorInvalidValue);
    OK(cudaFreeHost(h));
    EXPECT(cudaGetLastError(), cudaErrorInvalidValue);
}

static void test_pitch(void)
{
    void *p, *z = &z;
    size_t pitch = 0;
    OK(cudaMallocPitch(&p, &pitch, 100, 3));
    CHECK(pitch == 512 && fakecuda_used(0) == 1536, "pitch %zu used %zu", pitch, fakecuda_used(0));
    CHECK(fakecuda_device_of((char *)p + 1535) == 0, "one allocation of pitch * height");
    void *p2;
    OK(cudaMallocPitch(&p2, &pitch, 513, 2));
    CHECK(pitch == 1024 && (char *)p2 == (char *)p + 1536, "pitch %zu", pitch);
    OK(cudaMallocPitch(&z, &pitch, 0, 5));
    CHECK(z == NULL && pitch == 0, "empty");
    EXPECT(cudaMallocPitch(&z, NULL, 10, 10), cudaErrorInvalidValue);
    OK(cudaSetDevice(1));
    OK(cudaMallocPitch(&z, &pitch, 10, 1));
    CHECK(fakecuda_device_of(z) == 1, "on the current device");
    OK(cudaFree(z));
    OK(cudaSetDevice(0));
    EXPECT(cudaFree((char *)p + 512), cudaErrorInvalidValue);
    OK(cudaFree(p));
    OK(cudaFree(p2));
    CHECK(fakecuda_used(0) == 0, "freed");
    EXPECT(cudaGetLastError(), cudaErrorInvalidValue);
}

/* ---- counters, the framework, threads, capacity changes ------------------------------------------- */

static void test_counters(void)
{
    void *p;
    size_t pitch;
    fakecuda_reset_counters();
#define X(name) CHECK(fakecuda_calls(#name) == 0, "%s not reset", #name);
    FAKECUDA_FUNCS(X)
#undef X
    OK(cudaMalloc(&p, 100));
    OK(cudaFree(p));
    EXPECT(cudaMalloc(NULL, 100), cudaErrorInvalidValue);
    OK(cudaMalloc(&p, 0));
    OK(cudaMallocPitch(&p, &pitch, 10, 10));
    OK(cudaFree(p));
    EXPECT(cudaGetLastError(), cudaErrorInvalidValue);
    CHECK(fakecuda_calls("cudaMalloc") == 3, "cudaMalloc: %lu", fakecuda_calls("cudaMalloc"));
    CHECK(fakecuda_calls("cudaFree") == 2, "cudaFree: %lu", fakecuda_calls("cudaFree"));
    CHECK(fakecuda_calls("cudaMallocPitch") == 1, "cudaMallocPitch: %lu", fakecuda_calls("cudaMallocPitch"));
    CHECK(fakecuda_calls("cudaGetLastError") == 1, "cudaGetLastError: %lu", fakecuda_calls("cudaGetLastError"));
    CHECK(fakecuda_calls("cudaMemGetInfo") == 0, "not called");
    CHECK(fakecuda_calls("cudaNoSuchThing") == 0 && fakecuda_calls(NULL) == 0, "unknown names");
    (void)fakecuda_used(0); /* hooks are not counted */
    CHECK(fakecuda_calls("fakecuda_used") == 0, "hooks are not counted");
}

/* The framework library, loaded the way Python loads torch. */
static void test_framework(void)
{
    void *fw = dlopen(FAKEFRAMEWORK_PATH, RTLD_NOW | RTLD_LOCAL);
    CHECK(fw != NULL, "dlopen %s: %s", FAKEFRAMEWORK_PATH, dlerror());
    int (*fw_malloc)(void **, size_t) = (int (*)(void **, size_t))dlsym(fw, "fw_malloc");
    int (*fw_free)(void *) = (int (*)(void *))dlsym(fw, "fw_free");
    int (*fw_mem_get_info)(size_t *, size_t *) = (int (*)(size_t *, size_t *))dlsym(fw, "fw_mem_get_info");
    int (*fw_sync)(void) = (int (*)(void))dlsym(fw, "fw_sync");
    CHECK(fw_malloc && fw_free && fw_mem_get_info && fw_sync, "the framework exports fw_*");

    fakecuda_reset_counters();
    void *p;
    size_t f, t;
    OK(fw_malloc(&p, 1000));
    CHECK(fakecuda_device_of(p) == 0 && fakecuda_used(0) == 1024, "framework allocation");
    OK(fw_mem_get_info(&f, &t));
    CHECK(t == CAP0 && f == CAP0 - 1024, "framework cudaMemGetInfo");
    OK(fakecuda_enqueue_fill(NULL, p, 5, 1000));
    OK(fw_sync());
    CHECK(all(p, 5, 1000), "framework cudaDeviceSynchronize");
    OK(fw_free(p));
    CHECK(fakecuda_calls("cudaMalloc") == 1 && fakecuda_calls("cudaFree") == 1 &&
              fakecuda_calls("cudaMemGetInfo") == 1 && fakecuda_calls("cudaDeviceSynchronize") == 1,
          "the framework's calls reach this same runtime");
    dlclose(fw);
}

#define THREADS 8
#define ROUNDS 200

static void *thread_work(void *arg)
{
    int id = (int)(intptr_t)arg;
    /* per-thread current device and last error */
    if (cudaSetDevice(id & 1) != cudaSuccess || cudaSetDevice(9) != cudaErrorInvalidDevice)
        return "cudaSetDevice";
    cudaStream_t s;
    if (cudaStreamCreate(&s) != cudaSuccess)
        return "cudaStreamCreate";
    for (int i = 0; i < ROUNDS; i++) {
        unsigned char *p;
        if (cudaMalloc((void **)&p, 512 * (1 + (size_t)i % 4)) != cudaSuccess)
            return "cudaMalloc";
        if (fakecuda_device_of(p) != (id & 1))
            return "wrong device";
        if (fakecuda_enqueue_fill(s, p, id, 512) != cudaSuccess || cudaStreamSynchronize(s) != cudaSuccess)
            return "fill";
        if (!all(p, id, 512))
            return "another thread's fill landed in this thread's memory";
        if (cudaFree(p) != cudaSuccess)
            return "cudaFree";
    }
    if (cudaStreamDestroy(s) != cudaSuccess)
        return "cudaStreamDestroy";
    if (cudaGetLastError() != cudaErrorInvalidDevice || cudaGetLastError() != cudaSuccess)
        return "last error";
    return NULL;
}

static void test_threads(void)
{
    pthread_t th[THREADS];
    fakecuda_reset_counters();
    OK(cudaGetLastError());
    for (int i = 0; i < THREADS; i++)
        pthread_create(&th[i], NULL, thread_work, (void *)(intptr_t)i);
    for (int i = 0; i < THREADS; i++) {
        void *why;
        pthread_join(th[i], &why);
        CHECK(why == NULL, "thread %d: %s", i, (const char *)why);
    }
    int d;
    OK(cudaGetDevice(&d));
    CHECK(d == 0, "other threads' cudaSetDevice did not change this thread's device");
    OK(cudaPeekAtLastError());
    CHECK(fakecuda_calls("cudaMalloc") == THREADS * ROUNDS && fakecuda_calls("cudaFree") == THREADS * ROUNDS,
          "counters are exact under threads: %lu", fakecuda_calls("cudaMalloc"));
    CHECK(fakecuda_used(0) == 0 && fakecuda_used(1) == 0, "all freed");
}

/* The driver API's allocations: cuMemAlloc, cuMemFree, cuMemAllocAsync
 * through cudaGetDriverEntryPoint and cuGetProcAddress, and by name from
 * the stand-in libcuda.so.1; potentially unsafe calls during a capture. */
static void test_driver_alloc(void)
{
    fa_cu_result (*alloc)(fa_cu_ptr *, size_t) = NULL;
    fa_cu_result (*release)(fa_cu_ptr) = NULL;
    fa_cu_result (*async)(fa_cu_ptr *, size_t, cudaStream_t) = NULL;
    fa_cu_result (*proc)(const char *, void **, int, fa_cu_u64, fa_cu_proc_status *) = NULL;
    OK(cudaGetDriverEntryPoint("cuMemAlloc", (void **)&alloc, 0, NULL));
    OK(cudaGetDriverEntryPoint("cuMemFree", (void **)&release, 0, NULL));
    OK(cudaGetDriverEntryPoint("cuMemAllocAsync", (void **)&async, 0, NULL));
    OK(cudaGetDriverEntryPoint("cuGetProcAddress", (void **)&proc, 0, NULL));
    CHECK(alloc && release && async && proc, "found");
    void *create = NULL;
    fa_cu_proc_status st = 1;
    CHECK(proc("cuMemCreate", &create, 12000, 0, &st) == 0 && create && st == 0, "cuGetProcAddress finds");
    CHECK(proc("cuMemCreate", &create, 9000, 0, &st) != 0, "only for CUDA 10.2 and later");
    fa_cu_ptr p = 0, q = 0;
    size_t used = fakecuda_used(0);
    CHECK(alloc(&p, 4096) == 0 && fakecuda_device_of((void *)(uintptr_t)p) == 0, "cuMemAlloc: device memory");
    CHECK(alloc(&q, CAP0) == 2, "CUDA_ERROR_OUT_OF_MEMORY beyond the device");
    CHECK(release(p) == 0 && fakecuda_used(0) == used, "cuMemFree");
    CHECK(async(&p, 4096, NULL) == 0 && release(p) == 0, "cuMemAllocAsync");
    cudaStream_t s;
    cudaGraph_t gr;
    OK(cudaStreamCreate(&s));
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(alloc(&p, 4096) == cudaErrorStreamCaptureUnsupported, "cuMemAlloc is potentially unsafe");
    EXPECT(cudaStreamEndCapture(s, &gr), cudaErrorStreamCaptureInvalidated);
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    int mode = cudaStreamCaptureModeRelaxed;
    OK(cudaThreadExchangeStreamCaptureMode(&mode));
    CHECK(alloc(&p, 4096) == 0 && release(p) == 0, "allowed in relaxed mode");
    OK(cudaThreadExchangeStreamCaptureMode(&mode));
    OK(cudaStreamEndCapture(s, &gr));
    OK(cudaStreamDestroy(s));
    CLEAR_ERROR();
    /* libcuda.so.1 by name */
    void *drv = dlopen(FAKECUDADRV_PATH, RTLD_NOW | RTLD_LOCAL);
    CHECK(drv != NULL, "dlopen %s: %s", FAKECUDADRV_PATH, dlerror());
    fa_cu_result (*by_name)(fa_cu_ptr *, size_t) = (fa_cu_result(*)(fa_cu_ptr *, size_t))dlsym(drv, "cuMemAlloc_v2");
    fa_cu_result (*free_by_name)(fa_cu_ptr) = (fa_cu_result(*)(fa_cu_ptr))dlsym(drv, "cuMemFree_v2");
    CHECK(by_name && free_by_name && by_name(&p, 4096) == 0 && fakecuda_device_of((void *)(uintptr_t)p) == 0 &&
              free_by_name(p) == 0,
          "libcuda.so.1's cuMemAlloc_v2 and cuMemFree_v2");
    dlclose(drv);
}

/* fakecuda_set_entry_hook: once, on the calling thread, as the named call
 * enters (before it takes effect). */
static int hook_runs;
static size_t hook_saw_used;
static void entry_hook_fn(void)
{
    hook_runs++;
    hook_saw_used = fakecuda_used(0);
}

static void test_entry_hook(void)
{
    size_t used = fakecuda_used(0);
    fakecuda_set_entry_hook("cudaMalloc", entry_hook_fn);
    void *p, *q;
    OK(cudaFree(NULL)); /* another call: the hook waits */
    CHECK(hook_runs == 0, "the hook ran on another call");
    OK(cudaMalloc(&p, 4096));
    CHECK(hook_runs == 1 && hook_saw_used == used, "the hook ran %d times, before the call took effect", hook_runs);
    OK(cudaMalloc(&q, 4096));
    CHECK(hook_runs == 1, "the hook runs once");
    OK(cudaFree(p));
    OK(cudaFree(q));
}

static void test_set_capacity(void)
{
    void *p;
    fakecuda_set_capacity(0, 1 * MiB);
    CHECK(mem_total() == 1 * MiB && mem_free() == 1 * MiB, "shrunk");
    EXPECT(cudaMalloc(&p, 2 * MiB), cudaErrorMemoryAllocation);
    OK(cudaMalloc(&p, 1 * MiB));
    fakecuda_set_capacity(0, 512 * 1024); /* below what is allocated */
    CHECK(mem_free() == 0 && mem_total() == 512 * 1024, "free never goes negative");
    OK(cudaFree(p));
    fakecuda_set_capacity(0, CAP0);
    CHECK(mem_total() == CAP0, "restored");

    /* growing beyond the region: fine while the device is empty */
    OK(cudaSetDevice(1));
    fakecuda_set_capacity(1, 4 * CAP1);
    CHECK(mem_total() == 4 * CAP1, "grown");
    OK(cudaMalloc(&p, 3 * CAP1));
    CHECK(fakecuda_device_of((char *)p + 3 * CAP1 - 1) == 1, "the whole allocation is device 1 memory");
    memset((char *)p + 3 * CAP1 - 4096, 1, 4096); /* and it is mapped */
    OK(cudaFree(p));
    fakecuda_set_capacity(1, CAP1);
    OK(cudaSetDevice(0));
    EXPECT(cudaGetLastError(), cudaErrorMemoryAllocation);
}

/* ---- fork ---------------------------------------------------------------------------------------- */

/* In a forked child, report the first failed expectation by exit status. */
static int forked_child_checks(void)
{
    void *p = &p;
    int v = 0;
    if (cudaMalloc(&p, 512) != cudaErrorInitializationError)
        return 10;
    if (cudaGetDeviceCount(&v) != cudaErrorInitializationError || cudaFree(NULL) != cudaErrorInitializationError)
        return 11;
    if (cudaGetLastError() != cudaErrorInitializationError || cudaGetLastError() != cudaSuccess)
        return 12;
    if (cudaRuntimeGetVersion(&v) || v != 13000 || strcmp(cudaGetErrorString(3), "initialization error"))
        return 13;
    if (fakecuda_enqueue_fill(NULL, p, 0, 1) != cudaErrorInitializationError)
        return 14;
    if (fakecuda_used(0) != 4096) /* the hooks still show the inherited state */
        return 15;
    return 0;
}

static pthread_mutex_t busy_lock = PTHREAD_MUTEX_INITIALIZER;
static int busy_stop; /* under busy_lock */

static int busy_should_stop(void)
{
    pthread_mutex_lock(&busy_lock);
    int stop = busy_stop;
    pthread_mutex_unlock(&busy_lock);
    return stop;
}

static void *busy_thread(void *arg)
{
    (void)arg;
    while (!busy_should_stop()) {
        size_t f, t;
        cudaMemGetInfo(&f, &t);
    }
    return NULL;
}

static void test_fork(void)
{
    void *p;
    OK(cudaMalloc(&p, 4096));
    /* another thread is in and out of the runtime all the time: a child
     * must never inherit its lock held */
    pthread_t th;
    pthread_create(&th, NULL, busy_thread, NULL);
    for (int i = 0; i < 20; i++) {
        pid_t pid = fork();
        CHECK(pid >= 0, "fork");
        if (pid == 0) {
            alarm(10); /* a deadlock fails the check below instead of hanging */
            _exit(forked_child_checks());
        }
        int st;
        waitpid(pid, &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "forked child: %s %d", WIFEXITED(st) ? "exit" : "signal",
              WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    }
    pthread_mutex_lock(&busy_lock);
    busy_stop = 1;
    pthread_mutex_unlock(&busy_lock);
    pthread_join(th, NULL);
    OK(cudaFree(p)); /* the parent is unaffected */
}

/* ---- start-up environment, in child processes ------------------------------------------------------ */

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct slow_call {
    void *p;
    int returned;
};

static void *slow_malloc(void *arg)
{
    struct slow_call *c = arg;
    if (cudaMalloc(&c->p, 512))
        c->p = NULL;
    __atomic_store_n(&c->returned, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* FAKECUDA_DELAY_MS=400: cudaMalloc takes effect at once and returns
 * later, other threads reaching the runtime meanwhile; cuMemCreate and
 * cuMemAddressReserve return late too. */
static int delay_child(void)
{
    const double delay = 0.4;
    struct slow_call c = {NULL, 0};
    pthread_t t;
    double t0 = seconds();
    if (pthread_create(&t, NULL, slow_malloc, &c))
        return 1;
    while (fakecuda_used(0) == 0) { /* the hook takes the runtime's lock */
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    int meanwhile = !__atomic_load_n(&c.returned, __ATOMIC_ACQUIRE) && fakecuda_calls("cudaMalloc") == 1;
    pthread_join(t, NULL);
    if (!meanwhile || !c.p || seconds() - t0 < delay || cudaFree(c.p))
        return 1;
    fa_cu_result (*create)(fa_cu_handle *, size_t, const fa_cu_alloc_prop *, unsigned long long) = NULL;
    fa_cu_result (*reserve)(fa_cu_ptr *, size_t, size_t, fa_cu_ptr, unsigned long long) = NULL;
    fa_cu_result (*release)(fa_cu_handle) = NULL;
    fa_cu_result (*address_free)(fa_cu_ptr, size_t) = NULL;
    if (cudaGetDriverEntryPoint("cuMemCreate", (void **)&create, 0, NULL) ||
        cudaGetDriverEntryPoint("cuMemAddressReserve", (void **)&reserve, 0, NULL) ||
        cudaGetDriverEntryPoint("cuMemRelease", (void **)&release, 0, NULL) ||
        cudaGetDriverEntryPoint("cuMemAddressFree", (void **)&address_free, 0, NULL) || !create || !reserve ||
        !release || !address_free)
        return 1;
    fa_cu_alloc_prop prop;
    memset(&prop, 0, sizeof prop);
    prop.type = FA_CU_ALLOCATION_TYPE_PINNED;
    prop.location.type = FA_CU_LOCATION_TYPE_DEVICE;
    fa_cu_handle h;
    fa_cu_ptr r;
    const size_t G2 = (size_t)2 << 20;
    t0 = seconds();
    if (create(&h, G2, &prop, 0) || seconds() - t0 < delay || release(h))
        return 1;
    t0 = seconds();
    if (reserve(&r, G2, 0, 0, 0) || seconds() - t0 < delay || address_free(r, G2))
        return 1;
    return 0;
}

/* A kernel's illegal address (fakecuda_enqueue_fault) makes the context's
 * error sticky, as on an H200 with CUDA 13.0; another device goes on. */
static void *sticky_new_thread(void *arg)
{
    int *rc = arg;
    void *p;
    rc[0] = cudaPeekAtLastError(); /* a new thread has no last error... */
    rc[1] = cudaMalloc(&p, 512);   /* ...and meets the sticky one */
    return NULL;
}

static int sticky_child(void)
{
    cudaStream_t s;
    void *p, *q;
    size_t f, t;
    int st;
    OK(cudaMalloc(&p, 4096));
    OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    OK(fakecuda_enqueue_fault(s));
    OK(cudaMalloc(&q, 512)); /* not landed yet */
    EXPECT(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
    EXPECT(cudaPeekAtLastError(), cudaErrorIllegalAddress);
    EXPECT(cudaGetLastError(), cudaErrorIllegalAddress);
    OK(cudaPeekAtLastError());
    EXPECT(cudaMalloc(&q, 512), cudaErrorIllegalAddress);
    EXPECT(cudaPeekAtLastError(), cudaErrorIllegalAddress); /* cudaMalloc sets it, as every call that returns it */
    CLEAR_ERROR();
    EXPECT(cudaFree(p), cudaErrorIllegalAddress);
    EXPECT(cudaPeekAtLastError(), cudaErrorIllegalAddress);
    CLEAR_ERROR();
    EXPECT(cudaFree(NULL), cudaErrorIllegalAddress);
    EXPECT(cudaMemGetInfo(&f, &t), cudaErrorIllegalAddress);
    EXPECT(cudaStreamIsCapturing(s, &st), cudaErrorIllegalAddress);
    EXPECT(cudaStreamQuery(s), cudaErrorIllegalAddress);
    EXPECT(fakecuda_enqueue_fill(s, p, 1, 16), cudaErrorIllegalAddress);
    int d = -1, mode = cudaStreamCaptureModeRelaxed;
    OK(cudaGetDevice(&d));
    OK(cudaSetDevice(0));
    OK(cudaThreadExchangeStreamCaptureMode(&mode));
    OK(cudaThreadExchangeStreamCaptureMode(&mode));
    fa_cu_result (*create)(fa_cu_handle *, size_t, const fa_cu_alloc_prop *, unsigned long long) = NULL;
    fa_cu_result (*release)(fa_cu_handle) = NULL;
    OK(cudaGetDriverEntryPoint("cuMemCreate", (void **)&create, 0, NULL));
    OK(cudaGetDriverEntryPoint("cuMemRelease", (void **)&release, 0, NULL));
    fa_cu_alloc_prop prop = {.type = FA_CU_ALLOCATION_TYPE_PINNED, .location = {FA_CU_LOCATION_TYPE_DEVICE, 0}};
    fa_cu_handle h;
    CHECK(create(&h, 2 * MiB, &prop, 0) == 0 && release(h) == 0, "the virtual-memory calls still answer");
    int rc[2] = {-1, -1};
    pthread_t th;
    pthread_create(&th, NULL, sticky_new_thread, rc);
    pthread_join(th, NULL);
    CHECK(rc[0] == cudaSuccess && rc[1] == cudaErrorIllegalAddress, "a new thread: peek %d, cudaMalloc %d", rc[0],
          rc[1]);
    OK(cudaSetDevice(1)); /* another context */
    OK(cudaMalloc(&q, 512));
    OK(cudaFree(q));
    OK(cudaSetDevice(0));
    OK(cudaDeviceReset());
    EXPECT(cudaMalloc(&q, 512), cudaErrorIllegalAddress); /* a reset does not end it */
    return 0;
}

/* What a child does; returns its exit status. */
static int child(const char *mode)
{
    int n = -1;
    void *p;
    if (strcmp(mode, "calls") == 0) { /* three calls, for tracing */
        if (cudaMalloc(&p, 1024) || cudaFree(p) || cudaSetDevice(5) != cudaErrorInvalidDevice)
            return 1;
        return 0;
    }
    if (strcmp(mode, "nodevice") == 0) {
        if (cudaGetDeviceCount(&n) != cudaErrorNoDevice || n != 0 || cudaMalloc(&p, 1) != cudaErrorNoDevice)
            return 1;
        return cudaSetDevice(0) == cudaErrorNoDevice ? 0 : 1;
    }
    if (strcmp(mode, "defaults") == 0) {
        size_t f, t;
        if (cudaGetDeviceCount(&n) || n != 2 || cudaMemGetInfo(&f, &t) || t != ((size_t)1 << 30))
            return 1;
        return 0;
    }
    if (strcmp(mode, "forkfresh") == 0) { /* fork before using the driver: the child may use it */
        if (strcmp(cudaGetErrorName(0), "cudaSuccess") != 0) /* driverless: does not count as use */
            return 1;
        pid_t pid = fork();
        if (pid == 0)
            _exit(cudaMalloc(&p, 512) == cudaSuccess && cudaFree(p) == cudaSuccess ? 0 : 1);
        int st;
        waitpid(pid, &st, 0);
        return pid > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
    }
    if (strcmp(mode, "delay") == 0)
        return delay_child();
    if (strcmp(mode, "sticky") == 0)
        return sticky_child();
    if (strcmp(mode, "sizes") == 0) { /* FAKECUDA_DEVICES=3 FAKECUDA_MEM=1024K FAKECUDA_MEM_2=5000 */
        size_t f, t0, t2;
        if (cudaGetDeviceCount(&n) || n != 3 || cudaMemGetInfo(&f, &t0) || cudaSetDevice(2) ||
            cudaMemGetInfo(&f, &t2))
            return 1;
        return t0 == 1024 * 1024 && t2 == 5000 ? 0 : 1;
    }
    return 2;
}

static char self[4096];

/* Run this program as "--child mode" with the given environment
 * ("NAME=value" strings, NULL-terminated, added to a cleaned environment);
 * returns its exit status and what it wrote to stderr. */
static int run_child(const char *mode, const char *const *env, char *err, size_t errsz)
{
    int fds[2];
    CHECK(pipe(fds) == 0, "pipe");
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        close(fds[1]);
        static const char *const names[] = {"FAKECUDA_TRACE", "FAKECUDA_DEVICES", "FAKECUDA_MEM", "FAKECUDA_MEM_0",
                                            "FAKECUDA_MEM_1", "FAKECUDA_MEM_2", "FAKECUDA_DELAY_MS"};
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
            unsetenv(names[i]);
        for (; *env; env++)
            putenv((char *)*env);
        execl(self, self, "--child", mode, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    size_t len = 0;
    ssize_t r;
    while ((r = read(fds[0], err + len, errsz - 1 - len)) > 0)
        len += (size_t)r;
    err[len] = 0;
    close(fds[0]);
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

static void test_environment(void)
{
    char err[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    CHECK(n > 0, "readlink /proc/self/exe");
    self[n] = 0;

    int st = run_child("calls", (const char *const[]){"FAKECUDA_TRACE=1", NULL}, err, sizeof err);
    CHECK(st == 0, "traced child: status %d: %s", st, err);
    CHECK(count_lines(err) == 3, "one trace line per call, got:\n%s", err);
    CHECK(strstr(err, "fakecuda: cudaMalloc size=1024 ptr=0x") && strstr(err, "cudaFree ptr=0x") &&
              strstr(err, "cudaSetDevice device=5 -> cudaErrorInvalidDevice"),
          "trace content:\n%s", err);

    st = run_child("calls", (const char *const[]){NULL}, err, sizeof err);
    CHECK(st == 0 && err[0] == 0, "untraced child prints nothing: status %d: %s", st, err);
    st = run_child("calls", (const char *const[]){"FAKECUDA_TRACE=0", NULL}, err, sizeof err);
    CHECK(st == 0 && err[0] == 0, "FAKECUDA_TRACE=0 prints nothing: %s", err);

    st = run_child("nodevice", (const char *const[]){"FAKECUDA_DEVICES=0", NULL}, err, sizeof err);
    CHECK(st == 0 && err[0] == 0, "FAKECUDA_DEVICES=0: status %d: %s", st, err);

    st = run_child("defaults", (const char *const[]){NULL}, err, sizeof err);
    CHECK(st == 0 && err[0] == 0, "defaults: 2 devices of 1G: status %d: %s", st, err);
    st = run_child("defaults",
                   (const char *const[]){"FAKECUDA_DEVICES=lots", "FAKECUDA_MEM=12Q", "FAKECUDA_DELAY_MS=soon", NULL},
                   err, sizeof err);
    CHECK(st == 0, "bad values fall back to the defaults: status %d: %s", st, err);
    CHECK(strstr(err, "ignoring FAKECUDA_DEVICES=lots") && strstr(err, "ignoring FAKECUDA_MEM=12Q") &&
              strstr(err, "ignoring FAKECUDA_DELAY_MS=soon"),
          "and say so: %s", err);

    st = run_child("delay", (const char *const[]){"FAKECUDA_DELAY_MS=400", NULL}, err, sizeof err);
    CHECK(st == 0 && err[0] == 0, "FAKECUDA_DELAY_MS: calls take effect at once and return late: status %d: %s", st,
          err);

    st = run_child("sticky", (const char *const[]){"FAKECUDA_DEVICES=2", NULL}, err, sizeof err);
    CHECK(st == 0 && err[0] == 0, "sticky errors: status %d: %s", st, err);
    st = run_child("forkfresh", (const char *const[]){NULL}, err, sizeof err);
    CHECK(st == 0 && err[0] == 0, "a child forked before the driver was used can use it: status %d: %s", st, err);

    st = run_child("sizes",
                   (const char *const[]){"FAKECUDA_DEVICES=3", "FAKECUDA_MEM=1024K", "FAKECUDA_MEM_2=5000", NULL},
                   err, sizeof err);
    CHECK(st == 0 && err[0] == 0, "FAKECUDA_MEM suffixes and FAKECUDA_MEM_<n>: status %d: %s", st, err);
}

/* The driver's virtual-memory API, as strict as the real one where the
 * pool relies on it. */
static void test_vmm(void)
{
    struct {
#define X(name, params) fa_cu_result(*name) params;
        FA_CU_FUNCS(X)
#undef X
    } d;
    fa_cuda_entry_status st = 1;
#define X(name, params)                                                                                     \
    OK(cudaGetDriverEntryPointByVersion(#name, (void **)&d.name, 12000, 0, &st));                           \
    CHECK(d.name != NULL && st == 0, "entry point %s", #name);
    FA_CU_FUNCS(X)
#undef X
    void *nothing = (void *)1;
    OK(cudaGetDriverEntryPoint("cuNoSuchThing", &nothing, 0, &st));
    CHECK(nothing == NULL && st == 1, "an unknown symbol is not found");
    CHECK(fakecuda_calls("cuMemCreate") == 0, "lookups are not calls");

    const size_t G2 = (size_t)2 << 20;
    int v = -1;
    CHECK(d.cuDeviceGetAttribute(&v, FA_CU_ATTR_VMM_SUPPORTED, 0) == 0 && v == 1, "VMM supported");
    CHECK(d.cuDeviceGetAttribute(&v, FA_CU_ATTR_VMM_SUPPORTED, 9) == 101, "bad device");
    fa_cu_alloc_prop prop;
    memset(&prop, 0, sizeof prop);
    prop.type = FA_CU_ALLOCATION_TYPE_PINNED;
    prop.location.type = FA_CU_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t gran = 0;
    CHECK(d.cuMemGetAllocationGranularity(&gran, &prop, 0) == 0 && gran == G2, "granularity 2 MiB");

    /* Physical pieces count against the capacity, per piece. */
    size_t used0 = fakecuda_used(0);
    fa_cu_handle h1, h2, big;
    CHECK(d.cuMemCreate(&h1, G2 + 4096, &prop, 0) == 1, "sizes are whole granules");
    CHECK(d.cuMemCreate(&h1, G2, &prop, 0) == 0 && d.cuMemCreate(&h2, G2, &prop, 0) == 0, "two pieces");
    CHECK(fakecuda_used(0) == used0 + 2 * G2 && fakecuda_pieces(0) == 2 * G2, "counted");
    CHECK(d.cuMemCreate(&big, (size_t)64 << 20, &prop, 0) == 2, "beyond the capacity: out of memory");
    void *p = NULL;
    size_t f, t;
    OK(cudaMemGetInfo(&f, &t));
    EXPECT(cudaMalloc(&p, f + 512), cudaErrorMemoryAllocation); /* pieces and cudaMalloc share the device */
    CLEAR_ERROR();

    /* Mappings only inside a reservation; no access before cuMemSetAccess. */
    fa_cu_ptr r = 0;
    CHECK(d.cuMemAddressReserve(&r, 8 * G2, 0, 0, 0) == 0 && r % G2 == 0, "reserve");
    char *va = (char *)(uintptr_t)r;
    CHECK(d.cuMemMap((fa_cu_ptr)(uintptr_t)&v, G2, 0, h1, 0) == 1, "outside a reservation");
    CHECK(d.cuMemMap(r + 4096, G2, 0, h1, 0) == 1, "unaligned");
    CHECK(d.cuMemMap(r, G2, 0, h1, 0) == 0 && d.cuMemMap(r + G2, G2, 0, h2, 0) == 0, "two mappings");
    CHECK(d.cuMemMap(r, G2, 0, h2, 0) == 1, "over a mapping");
    EXPECT(fakecuda_enqueue_fill(NULL, va, 1, 16), cudaErrorInvalidValue); /* no access yet */
    CLEAR_ERROR();
    fa_cu_access_desc acc;
    memset(&acc, 0, sizeof acc);
    acc.location.type = FA_CU_LOCATION_TYPE_DEVICE;
    acc.location.id = 0;
    acc.flags = FA_CU_ACCESS_READWRITE;
    CHECK(d.cuMemSetAccess(r, 3 * G2, &acc, 1) == 1, "access only over mapped memory");
    CHECK(d.cuMemSetAccess(r, 2 * G2, &acc, 1) == 0, "access once for a run of mappings");
    va[0] = 5; /* the host (the tests) reads and writes it now */
    struct cudaPointerAttributes at;
    OK(cudaPointerGetAttributes(&at, va + G2 + 100));
    CHECK(at.type == cudaMemoryTypeDevice && at.device == 0 && at.devicePointer == va + G2 + 100,
          "mapped memory is device memory: type %d device %d", at.type, at.device);
    OK(cudaPointerGetAttributes(&at, va + 2 * G2));
    CHECK(at.type == cudaMemoryTypeUnregistered, "reserved, not mapped: %d", at.type);
    fa_cu_result (*range)(fa_cu_ptr *, size_t *, fa_cu_ptr) = NULL;
    OK(cudaGetDriverEntryPoint("cuMemGetAddressRange", (void **)&range, 0, &st));
    fa_cu_ptr rb = 0;
    size_t rs = 0;
    CHECK(range && range(&rb, &rs, r + G2 + 100) == 0 && rb == r + G2 && rs == G2, "the range of one piece's mapping");
    CHECK(range(&rb, &rs, r + 2 * G2) == 500, "not mapped: not found");
    OK(cudaMalloc(&p, 5000));
    CHECK(range(&rb, &rs, (fa_cu_ptr)(uintptr_t)p + 4000) == 0 && rb == (fa_cu_ptr)(uintptr_t)p && rs == 5120,
          "a cudaMalloc block: its base and (rounded) size");
    OK(cudaFree(p));
    CHECK(d.cuMemUnmap(r, G2 / 2) == 1 && d.cuMemUnmap(r, 3 * G2) == 1, "unmap whole mappings only");

    /* Unmapping waits for nothing: work queued before lands as a fault. */
    cudaStream_t s;
    OK(cudaStreamCreate(&s));
    OK(fakecuda_enqueue_fill(s, va, 0xAA, 2 * G2));
    unsigned long faults = fakecuda_faults(0);
    CHECK(d.cuMemUnmap(r, G2) == 0, "unmap one");
    CHECK(fakecuda_pending(0) == 1, "queued work still queued");
    OK(cudaStreamSynchronize(s));
    CHECK(fakecuda_faults(0) == faults + 1, "the write landed on unmapped memory: a fault");
    CHECK(d.cuMemRelease(h1) == 0 && fakecuda_pieces(0) == G2, "released once unmapped");
    CHECK(d.cuMemRelease(h2) == 0 && fakecuda_pieces(0) == G2, "released while mapped: freed at the unmap");
    CHECK(d.cuMemAddressFree(r, 8 * G2) == 1, "a reservation with mappings cannot go");
    CHECK(d.cuMemUnmap(r + G2, G2) == 0 && fakecuda_pieces(0) == 0, "freed");
    CHECK(d.cuMemAddressFree(r, 8 * G2) == 0, "reservation freed");
    CHECK(fakecuda_used(0) == used0, "nothing left");
    OK(cudaStreamDestroy(s));
    CHECK(fakecuda_calls("cuMemMap") == 5, "driver calls are counted: %lu", fakecuda_calls("cuMemMap"));

    /* GPUDirect RDMA: the device supports it with the virtual-memory API
     * (attribute 110); a piece created so can be registered, as cudaMalloc
     * memory can; one created without, not. */
    int gdr = -1;
    CHECK(d.cuDeviceGetAttribute(&gdr, FA_CU_ATTR_GDR_VMM_SUPPORTED, 0) == 0 && gdr == 1, "GPUDirect RDMA supported");
    fa_cu_alloc_prop rprop = prop;
    rprop.allocFlags.gpuDirectRDMACapable = 1;
    CHECK(d.cuMemAddressReserve(&r, 2 * G2, 0, 0, 0) == 0 && d.cuMemCreate(&h1, G2, &rprop, 0) == 0 &&
              d.cuMemCreate(&h2, G2, &prop, 0) == 0 && d.cuMemMap(r, G2, 0, h1, 0) == 0 &&
              d.cuMemMap(r + G2, G2, 0, h2, 0) == 0,
          "two pieces mapped");
    CHECK(fakecuda_rdma_capable((void *)(uintptr_t)r) == 1 && fakecuda_rdma_capable((void *)(uintptr_t)(r + G2)) == 0,
          "only the piece created RDMA capable is");
    OK(cudaMalloc(&p, 512));
    CHECK(fakecuda_rdma_capable(p) == 1, "cudaMalloc memory is");
    OK(cudaFree(p));
    CHECK(d.cuMemUnmap(r, 2 * G2) == 0 && d.cuMemRelease(h1) == 0 && d.cuMemRelease(h2) == 0 &&
              d.cuMemAddressFree(r, 2 * G2) == 0,
          "released");

    /* Pieces and mappings belong to no context (cuda.h: a context's
     * destruction leaves cuMemCreate's allocations): a reset leaves them. */
    CHECK(d.cuMemAddressReserve(&r, 2 * G2, 0, 0, 0) == 0 && d.cuMemCreate(&h1, G2, &prop, 0) == 0 &&
              d.cuMemMap(r, G2, 0, h1, 0) == 0,
          "a piece mapped");
    OK(cudaDeviceReset());
    CHECK(fakecuda_pieces(0) == G2 && fakecuda_mapped(0) == G2, "a reset leaves it");
    CHECK(d.cuMemUnmap(r, G2) == 0 && d.cuMemRelease(h1) == 0 && d.cuMemAddressFree(r, 2 * G2) == 0,
          "and it goes when released");
    CHECK(fakecuda_pieces(0) == 0 && fakecuda_used(0) == used0, "nothing left");
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--child") == 0)
        return child(argv[2]);

    /* The runtime reads its environment at its first call: set it first. */
    setenv("FAKECUDA_DEVICES", "2", 1);
    setenv("FAKECUDA_MEM", "64M", 1);
    unsetenv("FAKECUDA_MEM_0");
    setenv("FAKECUDA_MEM_1", "32m", 1);

    test_identity();
    test_devices_and_errors();
    test_capacity();
    test_free_rules();
    test_first_fit();
    test_two_devices();
    test_queued_work();
    test_reset();
    test_capture();
    test_entry_hook();
    test_driver_alloc();
    test_pointer_attributes();
    test_ipc();
    test_pitch();
    test_counters();
    test_framework();
    test_threads();
    test_set_capacity();
    test_fork();
    test_environment();
    test_vmm();

    CHECK(fakecuda_used(0) == 0 && fakecuda_used(1) == 0, "nothing left allocated");
    CHECK(fakecuda_pending(0) == 0 && fakecuda_pending(1) == 0, "nothing left queued");
    printf("fakecuda selftest: %u checks passed\n", checks);
    return 0;
}
