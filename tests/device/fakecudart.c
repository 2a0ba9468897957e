/* fakecudart.c - a stand-in for NVIDIA's libcudart.so.13, for forgealloc's tests only (no GPU needed).
 * Models: FAKECUDA_DEVICES devices whose memory is host memory (one mmap each, so tests can read it); cudaMalloc
 *   with 512-byte first-fit placement within a capacity (FAKECUDA_MEM[_<n>]); per-thread current device, last error
 *   and capture mode; streams and events whose work (fills, copies, event records, async frees) is queued and lands
 *   only at synchronisation points, with the legacy stream's implicit ordering; stream capture and its invalidation
 *   by illegal calls, with the rules an H200 (CUDA 13.0, driver 580) showed: synchronising the device is refused in
 *   every mode, the potentially unsafe calls (cudaMalloc, cudaFree, cudaMallocAsync on a stream not being
 *   captured, waiting for or querying another stream or an event) are refused where the thread's capture mode
 *   prohibits them, the virtual-memory calls and cudaMemGetInfo are always allowed, and work on the legacy stream
 *   while a blocking stream captures is refused with cudaErrorStreamCaptureImplicit; destroyed streams (handles never reused, calls naming them counted: fakecuda_stale_stream_uses); pointer attributes (mapped pieces are device memory); IPC handles; fork (driver calls in the
 *   child fail, as in CUDA); peer access to cudaMalloc memory; the driver's virtual-memory API (cuMemCreate, cuMemMap,
 *   ...: see "virtual memory" below) and cuMemGetAddressRange, reached only through
 *   cudaGetDriverEntryPoint[ByVersion]; FAKECUDA_VMM=0 makes devices report no support for it, FAKECUDA_GDR=0 none
 *   for GPUDirect RDMA with it (pieces asked to be RDMA capable are refused then),
 *   FAKECUDA_VMM=noentry makes the entry points find nothing; FAKECUDA_DELAY_MS=N (0..60000) makes cudaMalloc,
 *   cuMemCreate and cuMemAddressReserve slow: each takes effect (and is counted) at once and returns N ms later,
 *   the stand-in's lock not held meanwhile, so other threads' calls run while the caller waits;
 *   FAKECUDA_SYNC_DELAY_MS=N (0..60000) makes cudaDeviceSynchronize wait N ms, lock not held, before the device's
 *   work lands (a GPU with that much work queued); fakecuda_set_sync_error makes it fail; FAKECUDA_VM_US=N
 *   (0..60000) makes cuMemCreate, cuMemMap and cuMemSetAccess take N microseconds each, lock not held (on an
 *   H100 they took 13-22, 1-2 and 30-60); FAKECUDA_VM_FIRST_MS=N (0..60000) makes the process's first cuMemCreate
 *   return N ms late, lock not held (a driver's one-time set-up, or a thread descheduled in the call); sticky
 *   errors (fakecuda_enqueue_fault: after a kernel's illegal address every call that needs the context returns it,
 *   as on an H200).
 * Does not model: kernels (fakecuda_enqueue_fill stands in); concurrency (nothing runs in the background: work lands
 *   when someone synchronises); graphs (captured work never runs); memory pools, cudaStreamWaitEvent,
 *   event timing, per-thread default streams (they are the legacy stream), managed-memory migration.
 * Internal code never calls an exported function: a shim interposing one sees exactly the program's calls. */
#define _GNU_SOURCE
#include "fakecuda.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define FC_MAX_DEVICES 20
#define FC_DEFAULT_DEVICES 2
#define FC_DEFAULT_MEM ((size_t)1 << 30)
#define FC_ALIGN ((size_t)512) /* cudaMalloc alignment and granularity */
#define FC_VERSION 13000       /* cudaRuntimeGetVersion, cudaDriverGetVersion */

/* ---- state ----------------------------------------------------------------- */

/* One queued operation on a stream. */
enum op_kind { OP_FILL, OP_COPY, OP_EVENT, OP_FREE, OP_FAULT };
struct op {
    struct op *next;
    uint64_t seq; /* issue order, process-wide */
    enum op_kind kind;
    void *dst;            /* OP_FILL, OP_COPY */
    const void *src;      /* OP_COPY */
    size_t len;           /* OP_FILL, OP_COPY */
    unsigned char byte;   /* OP_FILL */
    struct alloc *target; /* OP_FREE */
    int device;           /* the device of the stream it was queued on */
};

/* A stream: created ones are on g.streams; each device has a legacy stream
 * (NULL, cudaStreamLegacy and cudaStreamPerThread all name it). */
struct CUstream_st {
    struct CUstream_st *next;
    uint64_t id; /* events refer to streams by id, never by pointer */
    int device;
    unsigned flags; /* cudaStreamNonBlocking */
    int is_legacy;
    struct op *head, *tail;
    size_t pending;
    int cap_status; /* cudaStreamCaptureStatus* */
    int cap_mode;   /* mode given to BeginCapture */
    const void *cap_thread;
    cudaGraph_t cap_graph; /* graph given to BeginCaptureToGraph */
};

struct CUevent_st {
    struct CUevent_st *next;
    int device;
    uint64_t stream_id; /* stream of the last record; 0: nothing to wait for */
    uint64_t seq;       /* the record's operation */
};

enum alloc_kind {
    AK_DEVICE,  /* cudaMalloc, cudaMallocPitch */
    AK_ASYNC,   /* cudaMallocAsync: device memory, cudaFree does not synchronise */
    AK_HOST,    /* cudaMallocHost, cudaHostAlloc */
    AK_MANAGED, /* cudaMallocManaged */
};
struct alloc {
    struct alloc *next;
    char *addr;
    size_t size; /* rounded: to FC_ALIGN on a device, to pages on the host */
    int device;  /* owner; for host and managed memory the device current at allocation */
    enum alloc_kind kind;
    int free_queued; /* a cudaFreeAsync is queued and has not landed */
    int graph;       /* from cudaMallocAsync on a capturing stream: a graph allocation */
};

struct device {
    char *base;            /* the region; NULL until the device is first used */
    size_t mapped;         /* bytes usable in the region (a guard page follows) */
    size_t capacity;       /* what cudaMalloc may use and cudaMemGetInfo reports */
    size_t used;           /* sum of the sizes of its allocations */
    struct alloc *allocs;  /* sorted by address */
    struct CUstream_st legacy;
    unsigned peers;        /* bit p: cudaDeviceEnablePeerAccess(p) was called with this device current */
    unsigned long faults;  /* queued work that landed on memory the device cannot reach */
    cudaError_t sticky;    /* the context's sticky error (fakecuda_enqueue_fault), 0: none */
};

/* The driver's virtual-memory API.  A physical piece (cuMemCreate) is only
 * a size counted against the device's capacity; reserved address space
 * (cuMemAddressReserve) is host address space mapped PROT_NONE; cuMemMap
 * puts fresh host memory there, still PROT_NONE until cuMemSetAccess gives
 * some device access (the host then reads and writes it, as tests do).
 * cuMemUnmap puts PROT_NONE back and waits for nothing: queued work that
 * lands there later is a fault (fakecuda_faults).  cuMemAddressFree keeps
 * the range (PROT_NONE, never reused), so work landing there after it
 * faults too.  A piece's contents do not follow it to another address. */
struct vm_piece {
    struct vm_piece *next, *prev;
    int device;
    size_t size;
    int maps;     /* mappings of it */
    int released; /* cuMemRelease was called: freed when the last mapping goes */
    int rdma;     /* created GPUDirect RDMA capable (allocFlags.gpuDirectRDMACapable) */
};
struct vm_reservation {
    struct vm_reservation *next;
    char *base;
    size_t size;
    struct vm_mapping **gran; /* per granule: the mapping over it, or NULL */
};
struct vm_mapping {
    struct vm_mapping *next, *prev;
    char *va;
    size_t size;
    struct vm_piece *piece;
    unsigned access; /* bit d: device d may read and write it */
};
#define FC_GRANULARITY ((size_t)2 << 20) /* what cuMemGetAllocationGranularity reports */

static struct {
    pthread_mutex_t lock; /* guards everything here */
    int ready;            /* the environment has been read */
    int trace;
    int ndev;
    struct device dev[FC_MAX_DEVICES];
    struct CUstream_st *streams; /* created streams */
    struct CUstream_st *dead_streams; /* destroyed ones, kept so that no new stream gets their handle */
    unsigned long stale_stream_uses;  /* calls that named one of them */
    struct CUevent_st *events;
    struct alloc *host_allocs; /* host and managed */
    uint64_t last_seq, last_stream_id;
    int captures;              /* streams between BeginCapture and EndCapture */
    int driver_used;           /* a function that needs the driver has been called */
    int forked_child;          /* forked after that: driver calls fail */
    int vmm;                   /* 1 supported, 0 devices report no support, -1 no entry points */
    unsigned delay_ms;         /* FAKECUDA_DELAY_MS */
    unsigned sync_delay_ms;    /* FAKECUDA_SYNC_DELAY_MS */
    unsigned vm_us;            /* FAKECUDA_VM_US */
    unsigned vm_first_ms;      /* FAKECUDA_VM_FIRST_MS */
    int vm_first_done;         /* the first cuMemCreate returned late */
    int gdr;                   /* FAKECUDA_GDR: GPUDirect RDMA with the virtual-memory API (default 1) */
    cudaError_t sync_error;    /* fakecuda_set_sync_error */
    unsigned busy_sync_ms;     /* fakecuda_set_busy_sync_ms */
    void (*entry_hook)(void);       /* fakecuda_set_entry_hook */
    int entry_hook_fn;              /* the FN_ of the call it waits for */
    struct vm_piece *pieces;
    struct vm_reservation *reservations;
    struct vm_reservation *freed_va; /* address space given back: work landing there faults */
    struct vm_mapping *mappings;
} g = {.lock = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local int tl_device; /* current device */
static _Thread_local cudaError_t tl_last_error;
static _Thread_local int tl_capture_mode; /* cudaStreamCaptureModeGlobal */
#define THIS_THREAD ((const void *)&tl_device) /* an address unique to the calling thread */

/* Per-function call counters, indexed by FN_<name>. */
enum fc_fn {
#define X(name) FN_##name,
    FAKECUDA_FUNCS(X) FAKECUDA_DRIVER_FUNCS(X)
#undef X
    FN_COUNT
};
static const char *const fn_names[FN_COUNT] = {
#define X(name) #name,
    FAKECUDA_FUNCS(X) FAKECUDA_DRIVER_FUNCS(X)
#undef X
};
/* Per-function call counters, one row per thread slot (threads take slots
 * round-robin; two threads sharing one still count right, atomically): a
 * counter line shared by all threads would make every call contend, which
 * the real runtime does not. */
#define FC_CALL_SLOTS 64
static struct {
    unsigned long n[FN_COUNT];
} __attribute__((aligned(64))) fn_calls[FC_CALL_SLOTS];
static unsigned next_call_slot;
static _Thread_local int tl_call_slot = -1;

static void count_call(enum fc_fn fn)
{
    if (tl_call_slot < 0)
        tl_call_slot = (int)(__atomic_fetch_add(&next_call_slot, 1, __ATOMIC_RELAXED) % FC_CALL_SLOTS);
    __atomic_fetch_add(&fn_calls[tl_call_slot].n[fn], 1, __ATOMIC_RELAXED);
}

/* ---- messages ---------------------------------------------------------------- */

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n > sizeof line - 2)
        n = sizeof line - 2;
    line[n++] = '\n';
    /* write(2), not stdio: no buffering, no allocation */
    for (const char *p = line; n > 0;) {
        ssize_t w = write(2, p, (size_t)n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        p += w;
        n -= (int)w;
    }
}

static void hook_misuse(const char *hook, int device)
{
    say("fakecuda: %s: no device %d (there are %d)", hook, device, g.ndev);
    abort();
}

struct err_desc {
    cudaError_t code;
    const char *name, *text; /* as the real cudaGetErrorName/String give them */
};
static const struct err_desc err_table[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorIllegalState, "cudaErrorIllegalState", "the operation cannot be performed in the present state"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit",
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

static const struct err_desc *err_find(cudaError_t e)
{
    for (size_t i = 0; i < sizeof err_table / sizeof err_table[0]; i++)
        if (err_table[i].code == e)
            return &err_table[i];
    return NULL;
}

/* ---- configuration ------------------------------------------------------------ */

/* "123", "64K", "512M", "2G", "1T" (binary multiples) -> bytes. */
static int parse_size(const char *s, size_t *out)
{
    if (!s || *s < '0' || *s > '9')
        return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno)
        return -1;
    unsigned shift = 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    case 't': case 'T': shift = 40; end++; break;
    }
    if (*end || v > (SIZE_MAX >> shift))
        return -1;
    *out = (size_t)v << shift;
    return 0;
}

/* A delay in milliseconds (0..60000) from the environment into *out. */
static void env_ms(const char *name, unsigned *out)
{
    const char *e = getenv(name);
    size_t ms;
    if (!e)
        return;
    if (parse_size(e, &ms) == 0 && ms <= 60000 && strspn(e, "0123456789") == strlen(e))
        *out = (unsigned)ms;
    else
        say("fakecuda: ignoring %s=%s (want 0..60000)", name, e);
}

static void init_locked(void)
{
    if (g.ready)
        return;
    const char *e = getenv("FAKECUDA_TRACE");
    g.trace = e && *e && strcmp(e, "0") != 0;

    g.ndev = FC_DEFAULT_DEVICES;
    if ((e = getenv("FAKECUDA_DEVICES"))) {
        size_t n;
        if (parse_size(e, &n) == 0 && n <= FC_MAX_DEVICES && strspn(e, "0123456789") == strlen(e))
            g.ndev = (int)n;
        else
            say("fakecuda: ignoring FAKECUDA_DEVICES=%s (want 0..%d)", e, FC_MAX_DEVICES);
    }
    g.vmm = 1;
    if ((e = getenv("FAKECUDA_VMM"))) {
        if (strcmp(e, "0") == 0)
            g.vmm = 0;
        else if (strcmp(e, "noentry") == 0)
            g.vmm = -1;
        else if (strcmp(e, "1") != 0)
            say("fakecuda: ignoring FAKECUDA_VMM=%s (want 1, 0 or noentry)", e);
    }
    g.gdr = 1;
    if ((e = getenv("FAKECUDA_GDR"))) {
        if (strcmp(e, "0") == 0 || strcmp(e, "1") == 0)
            g.gdr = *e == '1';
        else
            say("fakecuda: ignoring FAKECUDA_GDR=%s (want 1 or 0)", e);
    }
    env_ms("FAKECUDA_DELAY_MS", &g.delay_ms);
    env_ms("FAKECUDA_SYNC_DELAY_MS", &g.sync_delay_ms);
    env_ms("FAKECUDA_VM_US", &g.vm_us);
    env_ms("FAKECUDA_VM_FIRST_MS", &g.vm_first_ms);
    size_t mem = FC_DEFAULT_MEM;
    if ((e = getenv("FAKECUDA_MEM")) && parse_size(e, &mem) != 0) {
        say("fakecuda: ignoring FAKECUDA_MEM=%s (want bytes, or a number with K, M, G or T)", e);
        mem = FC_DEFAULT_MEM;
    }
    for (int d = 0; d < FC_MAX_DEVICES; d++) {
        char name[32];
        snprintf(name, sizeof name, "FAKECUDA_MEM_%d", d);
        g.dev[d].capacity = mem;
        if ((e = getenv(name)) && parse_size(e, &g.dev[d].capacity) != 0) {
            say("fakecuda: ignoring %s=%s", name, e);
            g.dev[d].capacity = mem;
        }
        struct CUstream_st *l = &g.dev[d].legacy;
        l->id = ++g.last_stream_id;
        l->device = d;
        l->is_legacy = 1;
    }
    __atomic_store_n(&g.ready, 1, __ATOMIC_RELEASE);
}

/* ---- entry and exit of every exported function ---------------------------------- */

static void lock(void)
{
    pthread_mutex_lock(&g.lock);
    init_locked();
}

static void unlock(void) { pthread_mutex_unlock(&g.lock); }

/* The functions that work without the driver, so also in a forked child. */
static int needs_driver(enum fc_fn fn)
{
    switch (fn) {
    case FN_cudaGetLastError:
    case FN_cudaPeekAtLastError:
    case FN_cudaGetErrorString:
    case FN_cudaGetErrorName:
    case FN_cudaRuntimeGetVersion:
    case FN_cudaDriverGetVersion:
        return 0;
    default:
        return 1;
    }
}

/* After a sticky error of its context (fakecuda_enqueue_fault), every
 * call that needs the context returns that error; these still answered
 * on an H200 with CUDA 13.0 (and the virtual-memory calls and lookups,
 * which need none): */
static int sticky_spares(enum fc_fn fn)
{
    switch (fn) {
    case FN_cudaGetDevice:
    case FN_cudaSetDevice:
    case FN_cudaGetDeviceCount:
    case FN_cudaThreadExchangeStreamCaptureMode:
    case FN_cudaPointerGetAttributes:
    case FN_cudaDeviceReset:
    case FN_cudaGetDriverEntryPoint:
    case FN_cudaGetDriverEntryPointByVersion:
    case FN_cuDeviceGetAttribute:
    case FN_cuMemGetAllocationGranularity:
    case FN_cuMemAddressReserve:
    case FN_cuMemAddressFree:
    case FN_cuMemCreate:
    case FN_cuMemRelease:
    case FN_cuMemMap:
    case FN_cuMemUnmap:
    case FN_cuMemSetAccess:
    case FN_cuMemGetAddressRange:
    case FN_cuGetProcAddress:
        return 1;
    default:
        return !needs_driver(fn);
    }
}

/* The sticky error a call of fn meets now on the thread's device, or 0. */
static cudaError_t sticky_for(enum fc_fn fn)
{
    return g.ndev && !sticky_spares(fn) ? g.dev[tl_device].sticky : cudaSuccess;
}

/* Count the call and take the lock.  Returns cudaErrorInitializationError
 * for a driver call in a child forked after the parent used the driver (as
 * CUDA does: it cannot be used across fork), the context's sticky error
 * where the call meets it, else cudaSuccess. */
static cudaError_t enter_counted(enum fc_fn fn)
{
    lock();
    if (!needs_driver(fn))
        return cudaSuccess;
    if (g.forked_child)
        return cudaErrorInitializationError;
    __atomic_store_n(&g.driver_used, 1, __ATOMIC_RELAXED);
    return sticky_for(fn);
}

/* fakecuda_set_entry_hook: run on the thread of the next call of its
 * function, as the call enters (the lock not held). */
static void entry_hook(enum fc_fn fn)
{
    if (__atomic_load_n(&g.entry_hook_fn, __ATOMIC_ACQUIRE) != (int)fn)
        return;
    void (*hook)(void) = __atomic_exchange_n(&g.entry_hook, NULL, __ATOMIC_ACQ_REL);
    if (hook)
        hook();
}

static cudaError_t enter(enum fc_fn fn)
{
    entry_hook(fn);
    count_call(fn);
    return enter_counted(fn);
}

/* The calls the real runtime answers from the calling thread's own state
 * (cudaGetDevice, cudaGetLastError, cudaPeekAtLastError) take no lock
 * there; two threads calling them must not contend here either.  Counts
 * the call; true with *rc set when it may go on without the lock (the
 * environment has been read, no trace line is due), false after taking
 * the lock as enter() does, with *rc set the same way. */
static bool enter_local(enum fc_fn fn, cudaError_t *rc)
{
    entry_hook(fn);
    count_call(fn);
    if (!__atomic_load_n(&g.ready, __ATOMIC_ACQUIRE) || g.trace) {
        *rc = enter_counted(fn);
        return false;
    }
    *rc = cudaSuccess;
    if (needs_driver(fn)) {
        if (__atomic_load_n(&g.forked_child, __ATOMIC_RELAXED))
            *rc = cudaErrorInitializationError;
        else if (!__atomic_load_n(&g.driver_used, __ATOMIC_RELAXED))
            __atomic_store_n(&g.driver_used, 1, __ATOMIC_RELAXED);
    }
    return true;
}

/* fork(): the forking thread holds the lock across it, so no other thread
 * is inside the runtime and the child's state is consistent; the child (whose
 * only thread is the forking one) releases it like the parent does. */
static void fork_prepare(void) { pthread_mutex_lock(&g.lock); }
static void fork_parent(void) { pthread_mutex_unlock(&g.lock); }
static void fork_child(void)
{
    if (__atomic_load_n(&g.driver_used, __ATOMIC_RELAXED))
        g.forked_child = 1;
    pthread_mutex_unlock(&g.lock);
}

__attribute__((constructor)) static void register_fork_handlers(void)
{
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}

/* Trace, record rc as the thread's last error if asked and it is an error
 * (cudaErrorNotReady is a status, not an error), unlock, return rc. */
static cudaError_t vleave(enum fc_fn fn, cudaError_t rc, int record, const char *fmt, va_list ap)
{
    if (!rc && needs_driver(fn) && !g.forked_child)
        rc = sticky_for(fn); /* the call itself landed the fault */
    if (record && rc != cudaSuccess && rc != cudaErrorNotReady)
        tl_last_error = rc;
    if (g.trace) {
        char args[400];
        vsnprintf(args, sizeof args, fmt, ap);
        const struct err_desc *d = err_find(rc);
        say("fakecuda: %s %s -> %s", fn_names[fn], args, d ? d->name : "?");
    }
    unlock();
    return rc;
}

static cudaError_t leave(enum fc_fn fn, cudaError_t rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static cudaError_t leave(enum fc_fn fn, cudaError_t rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    rc = vleave(fn, rc, 1, fmt, ap);
    va_end(ap);
    return rc;
}

/* leave() for the functions that report the last error: they do not set it. */
static cudaError_t leave_quiet(enum fc_fn fn, cudaError_t rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static cudaError_t leave_quiet(enum fc_fn fn, cudaError_t rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    rc = vleave(fn, rc, 0, fmt, ap);
    va_end(ap);
    return rc;
}

/* leave() for enter_local: records rc as leave() would, and unlocks only
 * if enter_local locked. */
static cudaError_t leave_local(bool unlocked, enum fc_fn fn, cudaError_t rc, int record, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static cudaError_t leave_local(bool unlocked, enum fc_fn fn, cudaError_t rc, int record, const char *fmt, ...)
{
    if (unlocked) {
        if (record && rc != cudaSuccess && rc != cudaErrorNotReady)
            tl_last_error = rc;
        return rc;
    }
    va_list ap;
    va_start(ap, fmt);
    rc = vleave(fn, rc, record, fmt, ap);
    va_end(ap);
    return rc;
}

/* FAKECUDA_DELAY_MS: called after leave(), so the lock is not held.  The
 * setting was read under the lock on this thread's way in. */
static void sleep_ms(unsigned ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static void slow_return(enum fc_fn fn)
{
    if (g.delay_ms && (fn == FN_cudaMalloc || fn == FN_cuMemCreate || fn == FN_cuMemAddressReserve))
        sleep_ms(g.delay_ms);
    if (fn == FN_cuMemCreate && g.vm_first_ms && !__atomic_exchange_n(&g.vm_first_done, 1, __ATOMIC_RELAXED))
        sleep_ms(g.vm_first_ms);
    if (g.vm_us && (fn == FN_cuMemCreate || fn == FN_cuMemMap || fn == FN_cuMemSetAccess)) {
        long want = (long)g.vm_us * 1000L;
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        do /* spin: a sleep this short oversleeps by tens of microseconds */
            clock_gettime(CLOCK_MONOTONIC, &t);
        while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < want);
    }
}

/* ---- devices and their regions ------------------------------------------------------ */

static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }

static cudaError_t current_device(int *d)
{
    if (g.ndev == 0)
        return cudaErrorNoDevice;
    *d = tl_device; /* cudaSetDevice only accepts valid ordinals */
    return cudaSuccess;
}

/* Map the device's region (its "context") if it has none: capacity bytes
 * rounded up to pages, then an inaccessible guard page so that running off
 * the end faults instead of landing in a neighbour. */
static cudaError_t ensure_context(int dev)
{
    struct device *d = &g.dev[dev];
    if (d->base)
        return cudaSuccess;
    size_t ps = page_size();
    size_t len = d->capacity ? d->capacity : 1;
    if (len > SIZE_MAX - 2 * ps)
        return cudaErrorMemoryAllocation;
    len = (len + ps - 1) / ps * ps;
    void *p = mmap(NULL, len + ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        say("fakecuda: cannot map %zu bytes for device %d: %s", len + ps, dev, strerror(errno));
        return cudaErrorInitializationError;
    }
    mprotect((char *)p + len, ps, PROT_NONE);
    d->base = p;
    d->mapped = len;
    return cudaSuccess;
}

/* The device whose region holds all of [p, p+n) (n may be 0), or -1. */
static int region_of(const void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p;
    for (int i = 0; i < g.ndev; i++) {
        const struct device *d = &g.dev[i];
        uintptr_t b = (uintptr_t)d->base;
        if (d->base && a >= b && a - b < d->mapped && n <= d->mapped - (a - b))
            return i;
    }
    return -1;
}

/* The device allocation containing p (any byte of it), or NULL. */
static struct alloc *device_alloc_at(const void *p)
{
    int dev = region_of(p, 1);
    if (dev < 0)
        return NULL;
    for (struct alloc *a = g.dev[dev].allocs; a; a = a->next)
        if ((const char *)p >= a->addr && (size_t)((const char *)p - a->addr) < a->size)
            return a;
    return NULL;
}

/* The host or managed allocation containing p, or NULL. */
static struct alloc *host_alloc_at(const void *p)
{
    for (struct alloc *a = g.host_allocs; a; a = a->next)
        if ((const char *)p >= a->addr && (size_t)((const char *)p - a->addr) < a->size)
            return a;
    return NULL;
}

/* The live allocation based at p that the program may still free: device
 * allocations without a queued cudaFreeAsync, and (if with_host) host and
 * managed ones.  NULL for anything else. */
static struct alloc *freeable_at(const void *p, int with_host)
{
    struct alloc *a = device_alloc_at(p);
    if (!a && with_host)
        a = host_alloc_at(p);
    if (!a || a->addr != p || a->free_queued)
        return NULL;
    return a;
}

/* The reservation containing all of [p, p+n), or NULL. */
static struct vm_reservation *reservation_of(const void *p, size_t n)
{
    for (struct vm_reservation *r = g.reservations; r; r = r->next) {
        uintptr_t a = (uintptr_t)p, b = (uintptr_t)r->base;
        if (a >= b && a - b < r->size && n <= r->size - (a - b))
            return r;
    }
    return NULL;
}

/* The mapping containing p, or NULL. */
static struct vm_mapping *mapping_at(const void *p)
{
    struct vm_reservation *r = reservation_of(p, 1);
    return r ? r->gran[(size_t)((const char *)p - r->base) / FC_GRANULARITY] : NULL;
}

/* Is every byte of [p, p+n) mapped with access for device dev (-1: for
 * some device)? */
static int vm_reachable(const void *p, size_t n, int dev)
{
    const char *c = p, *end = (const char *)p + (n ? n : 1);
    while (c < end) {
        struct vm_mapping *m = mapping_at(c);
        if (!m || !(dev < 0 ? m->access != 0 : (m->access >> dev) & 1))
            return 0;
        c = m->va + m->size;
    }
    return 1;
}

/* Can [p, p+n) be the device side of a copy or memset?  Device memory, or
 * host memory the runtime knows (pinned or managed). */
static int device_side_ok(const void *p, size_t n)
{
    if (!p)
        return 0;
    if (region_of(p, n) >= 0 || vm_reachable(p, n, -1))
        return 1;
    struct alloc *a = host_alloc_at(p);
    return a && n <= a->size - (size_t)((const char *)p - a->addr);
}

/* Allocate n bytes of the device's memory: FC_ALIGN-aligned, size rounded up
 * to FC_ALIGN, at the lowest address where it fits below the capacity. */
static cudaError_t device_alloc(int dev, size_t n, enum alloc_kind kind, void **out)
{
    if (n > SIZE_MAX - (FC_ALIGN - 1))
        return cudaErrorMemoryAllocation;
    size_t size = (n + FC_ALIGN - 1) & ~(FC_ALIGN - 1);
    cudaError_t rc = ensure_context(dev);
    if (rc)
        return rc;
    struct device *d = &g.dev[dev];
    size_t limit = d->capacity < d->mapped ? d->capacity : d->mapped;

    /* First fit: the first gap between allocations (sorted by address) that
     * is big enough.  Gaps further on are higher, so if this one ends above
     * the limit every other would too. */
    size_t off = 0;
    struct alloc **link = &d->allocs;
    for (struct alloc *a = d->allocs; a; a = a->next) {
        size_t a_off = (size_t)(a->addr - d->base);
        if (a_off - off >= size)
            break;
        off = a_off + a->size;
        link = &a->next;
    }
    if (off > limit || size > limit - off || size > d->capacity - (d->used < d->capacity ? d->used : d->capacity))
        return cudaErrorMemoryAllocation; /* no gap, or the device's physical pieces use the rest */

    struct alloc *na = calloc(1, sizeof *na);
    if (!na)
        return cudaErrorMemoryAllocation;
    na->addr = d->base + off;
    na->size = size;
    na->device = dev;
    na->kind = kind;
    na->next = *link;
    *link = na;
    d->used += size;
    *out = na->addr;
    return cudaSuccess;
}

/* Pinned and managed memory: pages of their own, not counted on a device. */
static cudaError_t host_alloc(size_t n, enum alloc_kind kind, void **out)
{
    int dev;
    cudaError_t rc = current_device(&dev);
    if (rc)
        return rc;
    size_t ps = page_size();
    if (n > SIZE_MAX - ps)
        return cudaErrorMemoryAllocation;
    size_t size = (n + ps - 1) / ps * ps;
    struct alloc *na = calloc(1, sizeof *na);
    if (!na)
        return cudaErrorMemoryAllocation;
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        free(na);
        return cudaErrorMemoryAllocation;
    }
    na->addr = p;
    na->size = size;
    na->device = dev;
    na->kind = kind;
    na->next = g.host_allocs;
    g.host_allocs = na;
    *out = p;
    return cudaSuccess;
}

static void release_alloc(struct alloc *a)
{
    struct alloc **link;
    if (a->kind == AK_HOST || a->kind == AK_MANAGED) {
        link = &g.host_allocs;
        munmap(a->addr, a->size);
    } else {
        link = &g.dev[a->device].allocs;
        g.dev[a->device].used -= a->size;
    }
    while (*link != a)
        link = &(*link)->next;
    *link = a->next;
    free(a);
}

/* ---- streams and the landing of queued work ------------------------------------------ */

static cudaError_t resolve_stream(cudaStream_t h, struct CUstream_st **out)
{
    if (h == NULL || h == cudaStreamLegacy || h == cudaStreamPerThread) {
        int dev;
        cudaError_t rc = current_device(&dev);
        if (rc)
            return rc;
        *out = &g.dev[dev].legacy;
        return cudaSuccess;
    }
    for (struct CUstream_st *s = g.streams; s; s = s->next)
        if (s == h) {
            *out = s;
            return cudaSuccess;
        }
    for (struct CUstream_st *s = g.dead_streams; s; s = s->next)
        if (s == h)
            g.stale_stream_uses++; /* undefined behaviour in CUDA: counted for the tests */
    return cudaErrorInvalidResourceHandle;
}

/* A destroyed stream (cudaStreamDestroy, cudaDeviceReset), off g.streams
 * with nothing queued: its memory is kept, so its handle never names a new
 * stream and a later call naming it is counted (fakecuda_stale_stream_uses);
 * the real runtime may reuse the handle, or crash. */
static void retire_stream(struct CUstream_st *s)
{
    s->next = g.dead_streams;
    g.dead_streams = s;
}

static struct CUstream_st *stream_by_id(uint64_t id)
{
    for (int d = 0; d < g.ndev; d++)
        if (g.dev[d].legacy.id == id)
            return &g.dev[d].legacy;
    for (struct CUstream_st *s = g.streams; s; s = s->next)
        if (s->id == id)
            return s;
    return NULL;
}

static struct CUevent_st *find_event(cudaEvent_t e)
{
    for (struct CUevent_st *x = g.events; x; x = x->next)
        if (x == e)
            return x;
    return NULL;
}

static int is_blocking(const struct CUstream_st *s) { return !(s->flags & cudaStreamNonBlocking); }

/* Work on the legacy stream (named NULL or cudaStreamLegacy) waits for
 * every blocking stream of its device: while one of those is being
 * captured, that dependency is not allowed, and the work is refused with
 * cudaErrorStreamCaptureImplicit and invalidates the capture (as an
 * H200 with CUDA 13.0 did for cudaEventRecord on stream 0; the per-thread
 * stream, which the stand-in runs as the legacy one, did not). */
static cudaError_t implicit_capture_conflict(cudaStream_t h, const struct CUstream_st *s)
{
    if (!s->is_legacy || h == cudaStreamPerThread)
        return cudaSuccess;
    cudaError_t rc = cudaSuccess;
    for (struct CUstream_st *t = g.streams; t; t = t->next)
        if (t->device == s->device && is_blocking(t) && t->cap_status != cudaStreamCaptureStatusNone) {
            t->cap_status = cudaStreamCaptureStatusInvalidated;
            rc = cudaErrorStreamCaptureImplicit;
        }
    return rc;
}

/* Queue a copy of *tmpl on s (named h).  *seq gets its sequence number,
 * or 0 when it was not queued: on a capturing stream work is recorded into
 * the graph, which never runs here. */
static cudaError_t enqueue(struct CUstream_st *s, cudaStream_t h, const struct op *tmpl, uint64_t *seq)
{
    *seq = 0;
    cudaError_t rc = implicit_capture_conflict(h, s);
    if (rc)
        return rc;
    if (s->cap_status == cudaStreamCaptureStatusInvalidated)
        return cudaErrorStreamCaptureInvalidated;
    if (s->cap_status == cudaStreamCaptureStatusActive)
        return cudaSuccess;
    struct op *o = malloc(sizeof *o);
    if (!o)
        return cudaErrorMemoryAllocation;
    *o = *tmpl;
    o->next = NULL;
    o->device = s->device;
    o->seq = ++g.last_seq;
    if (s->tail)
        s->tail->next = o;
    else
        s->head = o;
    s->tail = o;
    s->pending++;
    *seq = o->seq;
    return cudaSuccess;
}

static void land_stream(struct CUstream_st *s, uint64_t upto);

/* Before an operation issued at seq on s runs, the real device finishes the
 * work it implicitly waits for: an operation on the legacy stream waits for
 * everything issued earlier on the device's blocking streams, and one on a
 * blocking stream for everything issued earlier on the legacy stream.
 * Non-blocking streams wait for nothing. */
static void land_implicit_deps(struct CUstream_st *s, uint64_t seq)
{
    if (!is_blocking(s))
        return;
    if (s->is_legacy) {
        for (struct CUstream_st *t = g.streams; t; t = t->next)
            if (t->device == s->device && is_blocking(t))
                land_stream(t, seq - 1);
    } else {
        land_stream(&g.dev[s->device].legacy, seq - 1);
    }
}

/* Work on reserved address space touches it only where it is mapped with
 * access for the device when it lands: elsewhere it faults. */
static int lands(const struct op *o, const void *p, size_t n)
{
    bool freed = false;
    for (struct vm_reservation *r = g.freed_va; r && !freed; r = r->next)
        freed = (uintptr_t)p - (uintptr_t)r->base < r->size;
    if (!freed && (!reservation_of(p, 1) || vm_reachable(p, n, o->device)))
        return 1;
    g.dev[o->device].faults++;
    return 0;
}

static void apply(struct op *o)
{
    if ((o->kind == OP_FILL || o->kind == OP_COPY) &&
        (!lands(o, o->dst, o->len) || (o->kind == OP_COPY && region_of(o->src, o->len) < 0 && !lands(o, o->src, o->len))))
        return;
    switch (o->kind) {
    case OP_FILL:
        memset(o->dst, o->byte, o->len);
        break;
    case OP_COPY:
        memmove(o->dst, o->src, o->len);
        break;
    case OP_EVENT:
        break; /* a marker: events wait for it */
    case OP_FREE:
        release_alloc(o->target);
        break;
    case OP_FAULT: /* a kernel's illegal address: the context is unusable from now on */
        if (!g.dev[o->device].sticky)
            g.dev[o->device].sticky = cudaErrorIllegalAddress;
        break;
    }
}

/* Land s's operations issued at or before upto, oldest first. */
static void land_stream(struct CUstream_st *s, uint64_t upto)
{
    while (s->head && s->head->seq <= upto) {
        struct op *o = s->head;
        /* Dependencies are older than o, so o stays the head meanwhile. */
        land_implicit_deps(s, o->seq);
        s->head = o->next;
        if (!s->head)
            s->tail = NULL;
        s->pending--;
        apply(o);
        free(o);
    }
}

/* Land everything queued on the device's streams, in issue order. */
static void land_device(int dev)
{
    for (;;) {
        struct CUstream_st *oldest = NULL;
        if (g.dev[dev].legacy.head)
            oldest = &g.dev[dev].legacy;
        for (struct CUstream_st *s = g.streams; s; s = s->next)
            if (s->device == dev && s->head && (!oldest || s->head->seq < oldest->head->seq))
                oldest = s;
        if (!oldest)
            return;
        land_stream(oldest, oldest->head->seq);
    }
}

static void land_everything(void)
{
    for (int d = 0; d < g.ndev; d++)
        land_device(d);
}

/* Throw away s's queued work without running it. */
static void drop_queue(struct CUstream_st *s)
{
    while (s->head) {
        struct op *o = s->head;
        s->head = o->next;
        if (o->kind == OP_FREE)
            o->target->free_queued = 0;
        free(o);
    }
    s->tail = NULL;
    s->pending = 0;
}

static size_t pending_on(int dev)
{
    size_t n = g.dev[dev].legacy.pending;
    for (struct CUstream_st *s = g.streams; s; s = s->next)
        if (s->device == dev)
            n += s->pending;
    return n;
}

static size_t pending_anywhere(void)
{
    size_t n = 0;
    for (int d = 0; d < g.ndev; d++)
        n += pending_on(d);
    return n;
}

/* ---- stream capture ------------------------------------------------------------------- */

static void invalidate_captures(void)
{
    for (struct CUstream_st *s = g.streams; s; s = s->next)
        if (s->cap_status == cudaStreamCaptureStatusActive)
            s->cap_status = cudaStreamCaptureStatusInvalidated;
}

/* A synchronising call while any capture is under way (active or already
 * invalidated, until its EndCapture) is illegal and invalidates them all. */
static cudaError_t check_sync_allowed(void)
{
    if (!g.captures)
        return cudaSuccess;
    invalidate_captures();
    return cudaErrorStreamCaptureUnsupported;
}

/* A "potentially unsafe" call such as cudaMalloc, under the rules of
 * cudaThreadExchangeStreamCaptureMode: prohibited if this thread has a
 * capture not begun in relaxed mode, or - when this thread's mode is global -
 * if another thread has a capture begun in global mode; never in relaxed
 * mode.  A prohibited call invalidates the captures. */
static cudaError_t check_unsafe_allowed(void)
{
    if (tl_capture_mode == cudaStreamCaptureModeRelaxed)
        return cudaSuccess;
    int prohibited = 0;
    for (struct CUstream_st *s = g.streams; s; s = s->next) {
        if (s->cap_status == cudaStreamCaptureStatusNone || s->cap_mode == cudaStreamCaptureModeRelaxed)
            continue;
        if (s->cap_thread == THIS_THREAD ||
            (tl_capture_mode == cudaStreamCaptureModeGlobal && s->cap_mode == cudaStreamCaptureModeGlobal))
            prohibited = 1;
    }
    if (!prohibited)
        return cudaSuccess;
    invalidate_captures();
    return cudaErrorStreamCaptureUnsupported;
}

static void end_capture_of(struct CUstream_st *s)
{
    if (s->cap_status != cudaStreamCaptureStatusNone) {
        s->cap_status = cudaStreamCaptureStatusNone;
        g.captures--;
    }
}

/* What EndCapture returns when no graph was given: never dereferenced. */
static char dummy_graph;

/* ---- implementations ---------------------------------------------------------------------
 * Called with the lock held; the exported functions below wrap them. */

static cudaError_t do_set_device(int d)
{
    if (g.ndev == 0)
        return cudaErrorNoDevice;
    if (d < 0 || d >= g.ndev)
        return cudaErrorInvalidDevice;
    tl_device = d;
    return cudaSuccess;
}

/* During a capture the rule for potentially unsafe calls is applied
 * before the arguments are looked at: cudaMalloc(NULL, n) is refused, and
 * invalidates, where the mode prohibits the call.  (Which comes first in
 * the real runtime has not been measured; the stricter order is modelled,
 * so the shim does not rely on the other.) */
static cudaError_t do_malloc(void **p, size_t n)
{
    int dev;
    cudaError_t rc = current_device(&dev);
    if (!rc)
        rc = check_unsafe_allowed();
    if (!rc && !p)
        rc = cudaErrorInvalidValue;
    if (p)
        *p = NULL;
    if (!rc && n)
        rc = device_alloc(dev, n, AK_DEVICE, p);
    return rc;
}

static cudaError_t do_malloc_pitch(void **p, size_t *pitch, size_t w, size_t h)
{
    if (!p || !pitch)
        return cudaErrorInvalidValue;
    *p = NULL;
    int dev;
    cudaError_t rc = current_device(&dev);
    if (!rc)
        rc = check_unsafe_allowed();
    if (rc)
        return rc;
    if (w > SIZE_MAX - (FC_ALIGN - 1))
        return cudaErrorMemoryAllocation;
    size_t pt = (w + FC_ALIGN - 1) & ~(FC_ALIGN - 1);
    if (h && pt > SIZE_MAX / h)
        return cudaErrorMemoryAllocation;
    *pitch = pt;
    size_t n = pt * h;
    return n ? device_alloc(dev, n, AK_DEVICE, p) : cudaSuccess;
}

/* During a stream capture cudaFree is a "potentially unsafe" call, NULL
 * included (check_unsafe_allowed): where the thread's capture mode
 * prohibits it, it is refused with cudaErrorStreamCaptureUnsupported, the
 * captures are invalidated and nothing is freed; in relaxed mode it frees
 * as always (its wait covers queued work, and captured work is never
 * queued).  It is not refused as a device synchronisation: HIP, which
 * follows CUDA's capture rules, checks hipFree like hipMalloc, and programs
 * free in relaxed mode while a graph is being captured. */
static cudaError_t do_free(void *p)
{
    cudaError_t rc = check_unsafe_allowed();
    if (rc || !p)
        return rc;
    struct alloc *a = freeable_at(p, 1);
    if (!a || a->kind == AK_HOST)
        return cudaErrorInvalidValue;
    /* The real cudaFree synchronises the device, except for memory from
     * cudaMallocAsync (see its documentation). */
    if (a->kind != AK_ASYNC)
        land_device(a->device);
    release_alloc(a);
    return cudaSuccess;
}

static cudaError_t do_mem_get_info(size_t *free_b, size_t *total_b)
{
    if (!free_b || !total_b)
        return cudaErrorInvalidValue;
    int dev;
    cudaError_t rc = current_device(&dev);
    if (rc)
        return rc;
    const struct device *d = &g.dev[dev];
    *free_b = d->capacity > d->used ? d->capacity - d->used : 0;
    *total_b = d->capacity;
    return cudaSuccess;
}

/* Turn s's queued frees of device dev's memory into no-ops. */
static void forget_frees_on(struct CUstream_st *s, int dev)
{
    for (struct op *o = s->head; o; o = o->next)
        if (o->kind == OP_FREE && o->target->device == dev)
            o->kind = OP_EVENT; /* a marker that nothing waits for */
}

/* Like destroying the device's primary context: its queued work is dropped,
 * its streams, events and device allocations are gone, and the region reads
 * as zeroes.  Host and managed memory is left alone. */
static cudaError_t do_device_reset(void)
{
    int dev;
    cudaError_t rc = current_device(&dev);
    if (rc)
        return rc;
    struct device *d = &g.dev[dev];

    /* The driver waits for the device's queued work before it tears the
     * context down (a kernel's printf appears at the reset); work captured
     * into a graph never runs, and after a sync error nothing lands. */
    if (!g.sync_error)
        land_device(dev);
    drop_queue(&d->legacy);
    for (struct CUstream_st **link = &g.streams; *link;) {
        struct CUstream_st *s = *link;
        if (s->device != dev) {
            link = &s->next;
            continue;
        }
        end_capture_of(s);
        drop_queue(s);
        *link = s->next;
        retire_stream(s);
    }
    for (struct CUevent_st **link = &g.events; *link;) {
        struct CUevent_st *e = *link;
        if (e->device != dev) {
            link = &e->next;
            continue;
        }
        *link = e->next;
        free(e);
    }
    /* Other devices' streams may hold a cudaFreeAsync of this device's
     * memory: it is about to be freed, so those become no-ops. */
    for (struct CUstream_st *s = g.streams; s; s = s->next)
        forget_frees_on(s, dev);
    for (int i = 0; i < g.ndev; i++)
        forget_frees_on(&g.dev[i].legacy, dev);
    /* Physical pieces (cuMemCreate) and their mappings belong to no
     * context: cuda.h says a context's destruction leaves them, to be
     * released explicitly. */
    while (d->allocs)
        release_alloc(d->allocs);
    if (d->base)
        madvise(d->base, d->mapped, MADV_DONTNEED);
    return cudaSuccess;
}

static cudaError_t do_device_synchronize(void)
{
    int dev;
    cudaError_t rc = current_device(&dev);
    if (!rc)
        rc = check_sync_allowed();
    if (!rc)
        land_device(dev);
    return rc;
}

static cudaError_t do_stream_create(cudaStream_t *out, unsigned flags)
{
    if (!out || (flags & ~(unsigned)cudaStreamNonBlocking))
        return cudaErrorInvalidValue;
    int dev;
    cudaError_t rc = current_device(&dev);
    if (rc)
        return rc;
    struct CUstream_st *s = calloc(1, sizeof *s);
    if (!s)
        return cudaErrorMemoryAllocation;
    s->id = ++g.last_stream_id;
    s->device = dev;
    s->flags = flags;
    s->next = g.streams;
    g.streams = s;
    *out = s;
    return cudaSuccess;
}

/* Destroying a stream ends any capture on it.  Work still queued would
 * complete on a real device, so it lands here and now. */
static cudaError_t do_stream_destroy(cudaStream_t h)
{
    struct CUstream_st *s;
    cudaError_t rc = resolve_stream(h, &s);
    if (rc)
        return rc;
    if (s->is_legacy)
        return cudaErrorInvalidResourceHandle;
    end_capture_of(s);
    land_stream(s, UINT64_MAX);
    struct CUstream_st **link = &g.streams;
    while (*link != s)
        link = &(*link)->next;
    *link = s->next;
    retire_stream(s);
    return cudaSuccess;
}

/* During a capture, synchronising a created stream that is not being
 * captured is a potentially unsafe call (as on an H200, CUDA 13.0: legal
 * in relaxed mode and for another thread's thread-local capture); the
 * capturing stream itself, and the legacy stream (not measured), are
 * refused as every synchronisation is. */
static cudaError_t do_stream_synchronize(cudaStream_t h)
{
    struct CUstream_st *s;
    cudaError_t rc = resolve_stream(h, &s);
    if (!rc)
        rc = s->is_legacy || s->cap_status != cudaStreamCaptureStatusNone ? check_sync_allowed()
                                                                          : check_unsafe_allowed();
    if (!rc)
        land_stream(s, UINT64_MAX);
    return rc;
}

/* Querying a capturing stream is illegal and invalidates its capture;
 * querying another is a potentially unsafe call. */
static cudaError_t do_stream_query(cudaStream_t h)
{
    struct CUstream_st *s;
    cudaError_t rc = resolve_stream(h, &s);
    if (rc)
        return rc;
    if (s->cap_status != cudaStreamCaptureStatusNone) {
        s->cap_status = cudaStreamCaptureStatusInvalidated;
        return cudaErrorStreamCaptureUnsupported;
    }
    if ((rc = check_unsafe_allowed()))
        return rc;
    return s->pending ? cudaErrorNotReady : cudaSuccess;
}

static cudaError_t do_event_create(cudaEvent_t *out)
{
    if (!out)
        return cudaErrorInvalidValue;
    int dev;
    cudaError_t rc = current_device(&dev);
    if (rc)
        return rc;
    struct CUevent_st *e = calloc(1, sizeof *e);
    if (!e)
        return cudaErrorMemoryAllocation;
    e->device = dev;
    e->next = g.events;
    g.events = e;
    *out = e;
    return cudaSuccess;
}

static cudaError_t do_event_record(cudaEvent_t h, cudaStream_t sh)
{
    struct CUevent_st *e = find_event(h);
    if (!e)
        return cudaErrorInvalidResourceHandle;
    struct CUstream_st *s;
    cudaError_t rc = resolve_stream(sh, &s);
    if (rc)
        return rc;
    if (s->device != e->device)
        return cudaErrorInvalidResourceHandle;
    const struct op o = {.kind = OP_EVENT};
    uint64_t seq;
    if ((rc = enqueue(s, sh, &o, &seq)))
        return rc;
    /* A record inside a capture belongs to the graph: nothing to wait for. */
    e->stream_id = seq ? s->id : 0;
    e->seq = seq;
    return cudaSuccess;
}

/* Waiting for an event, and asking whether it happened, are potentially
 * unsafe calls during a capture (as on an H200, CUDA 13.0). */
static cudaError_t event_checked(cudaEvent_t h, struct CUevent_st **e, struct CUstream_st **s)
{
    *e = find_event(h);
    if (!*e)
        return cudaErrorInvalidResourceHandle;
    cudaError_t rc = check_unsafe_allowed();
    if (rc)
        return rc;
    /* NULL: a destroyed stream's work has landed already */
    *s = (*e)->stream_id ? stream_by_id((*e)->stream_id) : NULL;
    return cudaSuccess;
}

static cudaError_t do_event_synchronize(cudaEvent_t h)
{
    struct CUevent_st *e;
    struct CUstream_st *s;
    cudaError_t rc = event_checked(h, &e, &s);
    if (rc == cudaSuccess && s)
        land_stream(s, e->seq);
    return rc;
}

/* Work lands only when someone synchronises: the event happened once its
 * record has landed. */
static cudaError_t do_event_query(cudaEvent_t h)
{
    struct CUevent_st *e;
    struct CUstream_st *s;
    cudaError_t rc = event_checked(h, &e, &s);
    if (rc)
        return rc;
    return s && s->head && s->head->seq <= e->seq ? cudaErrorNotReady : cudaSuccess;
}

static cudaError_t do_event_destroy(cudaEvent_t h)
{
    struct CUevent_st **link = &g.events;
    while (*link && *link != h)
        link = &(*link)->next;
    if (!*link)
        return cudaErrorInvalidResourceHandle;
    struct CUevent_st *e = *link;
    *link = e->next;
    free(e);
    return cudaSuccess;
}

static cudaError_t do_pointer_attributes(struct cudaPointerAttributes *at, const void *p)
{
    if (!at)
        return cudaErrorInvalidValue;
    memset(at, 0, sizeof *at);
    struct alloc *a = device_alloc_at(p);
    if (a) {
        at->type = cudaMemoryTypeDevice;
        at->device = a->device;
        at->devicePointer = (void *)p;
        return cudaSuccess;
    }
    if ((a = host_alloc_at(p))) {
        at->type = a->kind == AK_MANAGED ? cudaMemoryTypeManaged : cudaMemoryTypeHost;
        at->device = a->device;
        at->devicePointer = (void *)p;
        at->hostPointer = (void *)p;
        return cudaSuccess;
    }
    struct vm_mapping *m = mapping_at(p);
    if (m) { /* a physical piece mapped there (cuMemMap): device memory of the piece's device */
        at->type = cudaMemoryTypeDevice;
        at->device = m->piece->device;
        at->devicePointer = (void *)p;
        return cudaSuccess;
    }
    at->type = cudaMemoryTypeUnregistered;
    at->device = cudaInvalidDeviceId;
    at->hostPointer = (void *)p;
    return cudaSuccess;
}

/* Check the device side(s) of a copy of n bytes. */
static cudaError_t check_copy(void *dst, const void *src, size_t n, int kind)
{
    if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault)
        return cudaErrorInvalidValue;
    if (!n)
        return cudaSuccess;
    if (!dst || !src)
        return cudaErrorInvalidValue;
    int dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    int src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if ((dst_dev && !device_side_ok(dst, n)) || (src_dev && !device_side_ok(src, n)))
        return cudaErrorInvalidValue;
    return cudaSuccess;
}

/* Synchronous copies and memsets: behind everything queued on the current
 * device, then at once. */
static cudaError_t do_memcpy(void *dst, const void *src, size_t n, int kind)
{
    int dev;
    cudaError_t rc = current_device(&dev);
    if (!rc)
        rc = check_copy(dst, src, n, kind);
    if (!rc)
        rc = check_sync_allowed();
    if (rc)
        return rc;
    land_device(dev);
    if (n)
        memmove(dst, src, n);
    return cudaSuccess;
}

static cudaError_t do_memset(void *p, int value, size_t n)
{
    int dev;
    cudaError_t rc = current_device(&dev);
    if (!rc && n && !device_side_ok(p, n))
        rc = cudaErrorInvalidValue;
    if (!rc)
        rc = check_sync_allowed();
    if (rc)
        return rc;
    land_device(dev);
    if (n)
        memset(p, value, n);
    return cudaSuccess;
}

static cudaError_t do_memcpy_async(void *dst, const void *src, size_t n, int kind, cudaStream_t h)
{
    struct CUstream_st *s;
    cudaError_t rc = resolve_stream(h, &s);
    if (!rc)
        rc = check_copy(dst, src, n, kind);
    if (rc || !n)
        return rc;
    const struct op o = {.kind = OP_COPY, .dst = dst, .src = src, .len = n};
    uint64_t seq;
    return enqueue(s, h, &o, &seq);
}

static cudaError_t do_memset_async(void *p, int value, size_t n, cudaStream_t h)
{
    struct CUstream_st *s;
    cudaError_t rc = resolve_stream(h, &s);
    if (rc || !n)
        return rc;
    if (!device_side_ok(p, n))
        return cudaErrorInvalidValue;
    const struct op o = {.kind = OP_FILL, .dst = p, .byte = (unsigned char)value, .len = n};
    uint64_t seq;
    return enqueue(s, h, &o, &seq);
}

/* Stream-ordered allocation is legal during capture; the memory is
 * allocated at once (there is no pool to defer to). */
static cudaError_t do_malloc_async(void **p, size_t n, cudaStream_t h)
{
    if (!p)
        return cudaErrorInvalidValue;
    *p = NULL;
    struct CUstream_st *s;
    cudaError_t rc = resolve_stream(h, &s);
    if (rc)
        return rc;
    if (s->cap_status == cudaStreamCaptureStatusInvalidated)
        return cudaErrorStreamCaptureInvalidated;
    if (s->cap_status == cudaStreamCaptureStatusNone && (rc = check_unsafe_allowed()))
        return rc; /* on a stream not being captured: a potentially unsafe call */
    if (!n)
        return cudaSuccess;
    rc = device_alloc(s->device, n, AK_ASYNC, p);
    if (!rc && s->cap_status == cudaStreamCaptureStatusActive)
        device_alloc_at(*p)->graph = 1; /* an allocation node of the graph */
    return rc;
}

/* The free happens when the stream's work lands.  On a capturing stream
 * it becomes a free node of the graph, which CUDA only accepts for a graph
 * allocation (cudaMallocAsync during a capture): anything else, memory
 * from cudaMalloc included, is refused with cudaErrorInvalidValue and stays
 * allocated (whether the real runtime also invalidates the capture then is
 * not modelled).  A recorded free never happens, and the memory stays
 * allocated. */
static cudaError_t do_free_async(void *p, cudaStream_t h)
{
    struct CUstream_st *s;
    cudaError_t rc = resolve_stream(h, &s);
    if (rc || !p)
        return rc;
    struct alloc *a = freeable_at(p, 0);
    if (!a || (s->cap_status == cudaStreamCaptureStatusActive && !a->graph))
        return cudaErrorInvalidValue;
    const struct op o = {.kind = OP_FREE, .target = a};
    uint64_t seq;
    if ((rc = enqueue(s, h, &o, &seq)))
        return rc;
    if (seq)
        a->free_queued = 1;
    return cudaSuccess;
}

static cudaError_t do_malloc_host(void **p, size_t n, unsigned flags, enum alloc_kind kind)
{
    if (!p)
        return cudaErrorInvalidValue;
    *p = NULL;
    if (kind == AK_MANAGED) {
        if (!n || (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost))
            return cudaErrorInvalidValue;
    } else if (flags & ~(unsigned)(cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined)) {
        return cudaErrorInvalidValue;
    }
    return n ? host_alloc(n, kind, p) : cudaSuccess;
}

/* Freeing pinned memory synchronises (queued copies may still read it). */
static cudaError_t do_free_host(void *p)
{
    if (!p)
        return cudaSuccess;
    cudaError_t rc = check_sync_allowed();
    if (rc)
        return rc;
    struct alloc *a = freeable_at(p, 1);
    if (!a || a->kind != AK_HOST)
        return cudaErrorInvalidValue;
    land_everything();
    release_alloc(a);
    return cudaSuccess;
}

static cudaError_t do_ipc_get_mem_handle(cudaIpcMemHandle_t *h, void *p)
{
    if (!h)
        return cudaErrorInvalidValue;
    struct alloc *a = freeable_at(p, 0);
    if (!a)
        return cudaErrorInvalidValue;
    struct fakecuda_ipc_payload pl = {.magic = {'f', 'a', 'k', 'e', 'c', 'u', 'd', 'a'},
                                      .device = a->device,
                                      .base = (uint64_t)(uintptr_t)a->addr};
    memset(h, 0, sizeof *h);
    memcpy(h->reserved, &pl, sizeof pl);
    return cudaSuccess;
}

/* The legacy stream cannot be captured (nor cudaStreamPerThread, which is
 * the legacy stream here). */
static cudaError_t do_begin_capture(cudaStream_t h, cudaGraph_t graph, int mode)
{
    if (mode < cudaStreamCaptureModeGlobal || mode > cudaStreamCaptureModeRelaxed)
        return cudaErrorInvalidValue;
    struct CUstream_st *s;
    cudaError_t rc = resolve_stream(h, &s);
    if (rc)
        return rc;
    if (s->is_legacy)
        return cudaErrorStreamCaptureUnsupported;
    if (s->cap_status != cudaStreamCaptureStatusNone)
        return cudaErrorIllegalState;
    s->cap_status = cudaStreamCaptureStatusActive;
    s->cap_mode = mode;
    s->cap_thread = THIS_THREAD;
    s->cap_graph = graph;
    g.captures++;
    return cudaSuccess;
}

static cudaError_t do_end_capture(cudaStream_t h, cudaGraph_t *out)
{
    if (!out)
        return cudaErrorInvalidValue;
    *out = NULL;
    struct CUstream_st *s;
    cudaError_t rc = resolve_stream(h, &s);
    if (rc)
        return rc;
    if (s->cap_status == cudaStreamCaptureStatusNone)
        return cudaErrorIllegalState;
    int invalidated = s->cap_status == cudaStreamCaptureStatusInvalidated;
    cudaGraph_t graph = s->cap_graph ? s->cap_graph : (cudaGraph_t)(void *)&dummy_graph;
    end_capture_of(s);
    if (invalidated)
        return cudaErrorStreamCaptureInvalidated;
    *out = graph;
    return cudaSuccess;
}

/* Asking the device of a capturing stream invalidates its capture, as
 * querying it does: on an H100 with CUDA 13.0 (driver 580) a
 * cudaStreamGetDevice right after cudaStreamBeginCapture left the capture
 * invalidated. */
static cudaError_t do_stream_get_device(cudaStream_t h, int *device)
{
    if (!device)
        return cudaErrorInvalidValue;
    struct CUstream_st *s;
    cudaError_t rc = resolve_stream(h, &s);
    if (rc)
        return rc;
    if (s->cap_status != cudaStreamCaptureStatusNone) {
        s->cap_status = cudaStreamCaptureStatusInvalidated;
        return cudaErrorStreamCaptureUnsupported;
    }
    *device = s->device;
    return rc;
}

static cudaError_t do_is_capturing(cudaStream_t h, int *status)
{
    if (!status)
        return cudaErrorInvalidValue;
    struct CUstream_st *s;
    cudaError_t rc = resolve_stream(h, &s);
    if (!rc)
        *status = s->cap_status;
    return rc;
}

static cudaError_t do_exchange_capture_mode(int *mode)
{
    if (!mode || *mode < cudaStreamCaptureModeGlobal || *mode > cudaStreamCaptureModeRelaxed)
        return cudaErrorInvalidValue;
    int old = tl_capture_mode;
    tl_capture_mode = *mode;
    *mode = old;
    return cudaSuccess;
}

static cudaError_t do_enqueue_fill(cudaStream_t h, void *dst, int byte, size_t len)
{
    struct CUstream_st *s;
    cudaError_t rc = resolve_stream(h, &s);
    if (rc || !len)
        return rc;
    int owner = region_of(dst, len);
    if (owner < 0 ? !vm_reachable(dst, len, s->device) : owner != s->device && !((g.dev[s->device].peers >> owner) & 1))
        return cudaErrorInvalidValue;
    const struct op o = {.kind = OP_FILL, .dst = dst, .byte = (unsigned char)byte, .len = len};
    uint64_t seq;
    return enqueue(s, h, &o, &seq);
}

/* ---- virtual memory (the driver API) ---------------------------------------------------
 * CUresult values used: 0 CUDA_SUCCESS, 1 CUDA_ERROR_INVALID_VALUE, 2 CUDA_ERROR_OUT_OF_MEMORY,
 * 3 CUDA_ERROR_NOT_INITIALIZED, 101 CUDA_ERROR_INVALID_DEVICE, 500 CUDA_ERROR_NOT_FOUND, 801 CUDA_ERROR_NOT_SUPPORTED. */

enum { CU_OK = 0, CU_INVALID = 1, CU_OOM = 2, CU_INVALID_DEVICE = 101, CU_NOT_FOUND = 500, CU_NOT_SUPPORTED = 801 };

static int granular(size_t v) { return v % FC_GRANULARITY == 0; }

static int prop_ok(const fa_cu_alloc_prop *p)
{
    return p && p->type == FA_CU_ALLOCATION_TYPE_PINNED && p->location.type == FA_CU_LOCATION_TYPE_DEVICE &&
           p->location.id >= 0 && p->location.id < g.ndev;
}

static int vmm_ok(int dev) { return g.vmm == 1 && dev >= 0 && dev < g.ndev; }

/* Live handles: an open-addressing set of piece addresses (0 empty, 1 deleted). */
static uintptr_t *handle_set;
static size_t handle_cap, handle_used;

static size_t handle_slot(uintptr_t h) { return (size_t)((h >> 4) * 0x9E3779B97F4A7C15ull) & (handle_cap - 1); }

static int handle_add(uintptr_t h)
{
    if ((handle_used + 1) * 2 > handle_cap) {
        size_t cap = handle_cap ? handle_cap * 2 : 256;
        uintptr_t *old = handle_set, *set = calloc(cap, sizeof *set);
        if (!set)
            return -1;
        size_t old_cap = handle_cap;
        handle_set = set, handle_cap = cap, handle_used = 0;
        for (size_t i = 0; i < old_cap; i++)
            if (old[i] > 1) {
                size_t j = handle_slot(old[i]);
                while (handle_set[j])
                    j = (j + 1) & (cap - 1);
                handle_set[j] = old[i];
                handle_used++;
            }
        free(old);
    }
    size_t j = handle_slot(h);
    while (handle_set[j] > 1)
        j = (j + 1) & (handle_cap - 1);
    if (!handle_set[j])
        handle_used++;
    handle_set[j] = h;
    return 0;
}

static size_t handle_find(uintptr_t h)
{
    for (size_t j = handle_cap ? handle_slot(h) : 0; handle_cap && handle_set[j]; j = (j + 1) & (handle_cap - 1))
        if (handle_set[j] == h)
            return j;
    return SIZE_MAX;
}

static void piece_free(struct vm_piece *pc)
{
    if (pc->prev)
        pc->prev->next = pc->next;
    else
        g.pieces = pc->next;
    if (pc->next)
        pc->next->prev = pc->prev;
    handle_set[handle_find((uintptr_t)pc)] = 1;
    g.dev[pc->device].used -= pc->size;
    free(pc);
}

static struct vm_piece *piece_find(fa_cu_handle h)
{
    return h > 1 && handle_find((uintptr_t)h) != SIZE_MAX ? (struct vm_piece *)(uintptr_t)h : NULL;
}

/* Fresh inaccessible address space at [va, va+n) (what unmapped reserved space is). */
static void vm_blank(char *va, size_t n)
{
    mmap(va, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
}

/* The mappings that make up exactly [va, va+n), contiguous: their number,
 * or -1 if the range is not a run of whole mappings. */
static int whole_mappings(const char *va, size_t n)
{
    int count = 0;
    const char *c = va, *end = va + n;
    while (c < end) {
        struct vm_mapping *m = mapping_at(c);
        if (!m || m->va != c || m->size > (size_t)(end - c))
            return -1;
        c += m->size;
        count++;
    }
    return n ? count : -1;
}

/* The device attributes the stand-in knows: virtual-memory support, and
 * GPUDirect RDMA with it (an H200 reports 1). */
static int do_cu_get_attribute(int *v, fa_cu_attr a, int dev)
{
    if (dev < 0 || dev >= g.ndev)
        return CU_INVALID_DEVICE;
    if (!v || (a != FA_CU_ATTR_VMM_SUPPORTED && a != FA_CU_ATTR_GDR_VMM_SUPPORTED))
        return CU_INVALID;
    *v = g.vmm == 1 && (a == FA_CU_ATTR_VMM_SUPPORTED || g.gdr);
    return CU_OK;
}

static int do_cu_granularity(size_t *gr, const fa_cu_alloc_prop *p, fa_cu_gran_flags f)
{
    if (!gr || !prop_ok(p) || (f != 0 && f != 1))
        return CU_INVALID;
    if (!vmm_ok(p->location.id))
        return CU_NOT_SUPPORTED;
    *gr = FC_GRANULARITY;
    return CU_OK;
}

static int do_cu_reserve(fa_cu_ptr *out, size_t size, size_t align, unsigned long long flags)
{
    if (!out || !size || !granular(size) || flags || (align & (align - 1)))
        return CU_INVALID;
    if (g.vmm != 1)
        return CU_NOT_SUPPORTED;
    size_t a = align > FC_GRANULARITY ? align : FC_GRANULARITY;
    if (size > SIZE_MAX - a)
        return CU_OOM;
    char *p = mmap(NULL, size + a, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return CU_OOM;
    char *base = (char *)(((uintptr_t)p + a - 1) & ~(uintptr_t)(a - 1));
    if (base > p)
        munmap(p, (size_t)(base - p));
    if (base + size < p + size + a)
        munmap(base + size, (size_t)(p + size + a - (base + size)));
    struct vm_reservation *r = calloc(1, sizeof *r);
    if (r && !(r->gran = calloc(size / FC_GRANULARITY, sizeof *r->gran))) {
        free(r);
        r = NULL;
    }
    if (!r) {
        munmap(base, size);
        return CU_OOM;
    }
    r->base = base;
    r->size = size;
    r->next = g.reservations;
    g.reservations = r;
    *out = (fa_cu_ptr)(uintptr_t)base;
    return CU_OK;
}

/* Freeing reserved space that still has mappings is refused. */
static int do_cu_address_free(fa_cu_ptr ptr, size_t size)
{
    struct vm_reservation **link = &g.reservations;
    while (*link && ((*link)->base != (char *)(uintptr_t)ptr || (*link)->size != size))
        link = &(*link)->next;
    if (!*link)
        return CU_INVALID;
    struct vm_reservation *r = *link;
    for (size_t i = 0; i < r->size / FC_GRANULARITY; i++)
        if (r->gran[i])
            return CU_INVALID;
    *link = r->next;
    free(r->gran);
    r->gran = NULL;
    r->next = g.freed_va;
    g.freed_va = r;
    return CU_OK;
}

static int do_cu_create(fa_cu_handle *h, size_t size, const fa_cu_alloc_prop *p, unsigned long long flags)
{
    if (!h || !prop_ok(p) || !size || !granular(size) || flags)
        return CU_INVALID;
    if (!vmm_ok(p->location.id) || (p->allocFlags.gpuDirectRDMACapable && !g.gdr))
        return CU_NOT_SUPPORTED;
    struct device *d = &g.dev[p->location.id];
    if (d->used > d->capacity || size > d->capacity - d->used)
        return CU_OOM;
    struct vm_piece *pc = calloc(1, sizeof *pc);
    if (!pc || handle_add((uintptr_t)pc) != 0) {
        free(pc);
        return CU_OOM;
    }
    pc->device = p->location.id;
    pc->size = size;
    pc->rdma = p->allocFlags.gpuDirectRDMACapable != 0;
    pc->next = g.pieces;
    if (g.pieces)
        g.pieces->prev = pc;
    g.pieces = pc;
    d->used += size;
    *h = (fa_cu_handle)(uintptr_t)pc;
    return CU_OK;
}

static int do_cu_release(fa_cu_handle h)
{
    struct vm_piece *pc = piece_find(h);
    if (!pc || pc->released)
        return CU_INVALID;
    pc->released = 1;
    if (!pc->maps)
        piece_free(pc);
    return CU_OK;
}

/* Only inside a reservation, over nothing mapped, at granularity. */
static int do_cu_map(fa_cu_ptr ptr, size_t size, size_t off, fa_cu_handle h, unsigned long long flags)
{
    char *va = (char *)(uintptr_t)ptr;
    struct vm_piece *pc = piece_find(h);
    struct vm_reservation *r = reservation_of(va, size);
    if (!pc || pc->released || flags || !size || !granular(ptr) || !granular(size) || !granular(off) ||
        off > pc->size || size > pc->size - off || !r)
        return CU_INVALID;
    size_t first = (size_t)(va - r->base) / FC_GRANULARITY, count = size / FC_GRANULARITY;
    for (size_t i = first; i < first + count; i++)
        if (r->gran[i])
            return CU_INVALID;
    struct vm_mapping *m = calloc(1, sizeof *m);
    if (!m)
        return CU_OOM;
    vm_blank(va, size);
    m->va = va;
    m->size = size;
    m->piece = pc;
    m->next = g.mappings;
    if (g.mappings)
        g.mappings->prev = m;
    g.mappings = m;
    for (size_t i = first; i < first + count; i++)
        r->gran[i] = m;
    pc->maps++;
    return CU_OK;
}

static void unmap_one(struct vm_mapping *m)
{
    if (m->prev)
        m->prev->next = m->next;
    else
        g.mappings = m->next;
    if (m->next)
        m->next->prev = m->prev;
    struct vm_reservation *r = reservation_of(m->va, m->size);
    size_t first = (size_t)(m->va - r->base) / FC_GRANULARITY;
    for (size_t i = first; i < first + m->size / FC_GRANULARITY; i++)
        r->gran[i] = NULL;
    vm_blank(m->va, m->size);
    struct vm_piece *pc = m->piece;
    if (--pc->maps == 0 && pc->released)
        piece_free(pc);
    free(m);
}

/* Whole mappings only; queued work is not waited for. */
static int do_cu_unmap(fa_cu_ptr ptr, size_t size)
{
    char *va = (char *)(uintptr_t)ptr;
    if (whole_mappings(va, size) < 0)
        return CU_INVALID;
    for (char *c = va; c < va + size;) {
        struct vm_mapping *m = mapping_at(c);
        c += m->size;
        unmap_one(m);
    }
    return CU_OK;
}

/* The range must be a run of whole mappings; each descriptor names a device. */
static int do_cu_set_access(fa_cu_ptr ptr, size_t size, const fa_cu_access_desc *desc, size_t n)
{
    char *va = (char *)(uintptr_t)ptr;
    if (!desc || !n || whole_mappings(va, size) < 0)
        return CU_INVALID;
    for (size_t i = 0; i < n; i++)
        if (desc[i].location.type != FA_CU_LOCATION_TYPE_DEVICE || desc[i].location.id < 0 ||
            desc[i].location.id >= g.ndev || (desc[i].flags != 0 && desc[i].flags != 1 && desc[i].flags != 3))
            return desc[i].location.id >= g.ndev ? CU_INVALID_DEVICE : CU_INVALID;
    for (char *c = va; c < va + size;) {
        struct vm_mapping *m = mapping_at(c);
        for (size_t i = 0; i < n; i++) {
            unsigned bit = 1u << desc[i].location.id;
            m->access = desc[i].flags ? m->access | bit : m->access & ~bit;
        }
        mprotect(m->va, m->size, m->access ? PROT_READ | PROT_WRITE : PROT_NONE);
        c += m->size;
    }
    return CU_OK;
}

/* The allocation holding p: a device allocation of the runtime (cudaMalloc,
 * cudaMallocAsync, ...), or the mapping of one physical piece: for memory
 * mapped with cuMemMap the real driver answers with the piece's mapping,
 * not the reservation nor neighbouring pieces. */
static int do_cu_address_range(fa_cu_ptr *base, size_t *size, fa_cu_ptr ptr)
{
    const void *p = (const void *)(uintptr_t)ptr;
    struct alloc *a = device_alloc_at(p);
    struct vm_mapping *m = a ? NULL : mapping_at(p);
    if (!a && !m)
        return CU_NOT_FOUND;
    if (base)
        *base = (fa_cu_ptr)(uintptr_t)(a ? a->addr : m->va);
    if (size)
        *size = a ? a->size : m->size;
    return CU_OK;
}

static cudaError_t do_enable_peer_access(int peer, unsigned flags)
{
    int dev;
    cudaError_t rc = current_device(&dev);
    if (rc)
        return rc;
    if (peer < 0 || peer >= g.ndev || peer == dev)
        return cudaErrorInvalidDevice;
    if (flags)
        return cudaErrorInvalidValue;
    if ((g.dev[dev].peers >> peer) & 1)
        return cudaErrorPeerAccessAlreadyEnabled;
    g.dev[dev].peers |= 1u << peer;
    return cudaSuccess;
}

/* ---- the exported runtime functions ----------------------------------------------------
 * Each counts itself and takes the lock in enter() (which refuses driver
 * calls in a forked child), runs its implementation, and leaves through
 * leave(), which traces, records errors and unlocks.  None calls another
 * exported function. */

#define OUT_PTR(pp) ((pp) ? *(pp) : NULL)

FAKECUDA_API cudaError_t cudaGetDeviceCount(int *count)
{
    cudaError_t rc = enter(FN_cudaGetDeviceCount);
    if (!rc && !count)
        rc = cudaErrorInvalidValue;
    if (!rc) {
        *count = g.ndev;
        rc = g.ndev ? cudaSuccess : cudaErrorNoDevice;
    }
    return leave(FN_cudaGetDeviceCount, rc, "count=%d", g.ndev);
}

FAKECUDA_API cudaError_t cudaGetDevice(int *device)
{
    cudaError_t rc;
    bool unlocked = enter_local(FN_cudaGetDevice, &rc);
    int dev = -1;
    if (!rc)
        rc = device ? current_device(&dev) : cudaErrorInvalidValue;
    if (!rc)
        *device = dev;
    return leave_local(unlocked, FN_cudaGetDevice, rc, 1, "device=%d", dev);
}

FAKECUDA_API cudaError_t cudaSetDevice(int device)
{
    cudaError_t rc = enter(FN_cudaSetDevice);
    if (!rc)
        rc = do_set_device(device);
    return leave(FN_cudaSetDevice, rc, "device=%d", device);
}

FAKECUDA_API cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    cudaError_t rc = enter(FN_cudaMalloc);
    if (!rc)
        rc = do_malloc(devPtr, size);
    rc = leave(FN_cudaMalloc, rc, "size=%zu ptr=%p", size, OUT_PTR(devPtr));
    slow_return(FN_cudaMalloc);
    return rc;
}

FAKECUDA_API cudaError_t cudaFree(void *devPtr)
{
    cudaError_t rc = enter(FN_cudaFree);
    if (!rc)
        rc = do_free(devPtr);
    return leave(FN_cudaFree, rc, "ptr=%p", devPtr);
}

FAKECUDA_API cudaError_t cudaMemGetInfo(size_t *free, size_t *total)
{
    cudaError_t rc = enter(FN_cudaMemGetInfo);
    if (!rc)
        rc = do_mem_get_info(free, total);
    return leave(FN_cudaMemGetInfo, rc, "free=%zu total=%zu", rc ? 0 : *free, rc ? 0 : *total);
}

FAKECUDA_API cudaError_t cudaDeviceReset(void)
{
    cudaError_t rc = enter(FN_cudaDeviceReset);
    if (!rc)
        rc = do_device_reset();
    return leave(FN_cudaDeviceReset, rc, "device=%d", tl_device);
}

FAKECUDA_API cudaError_t cudaDeviceSynchronize(void)
{
    cudaError_t rc = enter(FN_cudaDeviceSynchronize);
    if (!rc && g.sync_error)
        rc = g.sync_error; /* nothing lands, as after a sticky error */
    unsigned ms = rc                ? 0
                  : g.sync_delay_ms ? g.sync_delay_ms
                  : g.busy_sync_ms && pending_on(tl_device) ? g.busy_sync_ms
                                                             : 0;
    if (ms) {
        /* The queued work takes this long: other threads call (and queue
         * more) meanwhile; what is queued when the wait ends lands. */
        unlock();
        sleep_ms(ms);
        lock();
    }
    if (!rc)
        rc = do_device_synchronize();
    return leave(FN_cudaDeviceSynchronize, rc, "device=%d", tl_device);
}

FAKECUDA_API cudaError_t cudaStreamCreate(cudaStream_t *pStream)
{
    cudaError_t rc = enter(FN_cudaStreamCreate);
    if (!rc)
        rc = do_stream_create(pStream, cudaStreamDefault);
    return leave(FN_cudaStreamCreate, rc, "stream=%p", rc ? NULL : (void *)*pStream);
}

FAKECUDA_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags)
{
    cudaError_t rc = enter(FN_cudaStreamCreateWithFlags);
    if (!rc)
        rc = do_stream_create(pStream, flags);
    return leave(FN_cudaStreamCreateWithFlags, rc, "flags=%u stream=%p", flags, rc ? NULL : (void *)*pStream);
}

FAKECUDA_API cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    cudaError_t rc = enter(FN_cudaStreamDestroy);
    if (!rc)
        rc = do_stream_destroy(stream);
    return leave(FN_cudaStreamDestroy, rc, "stream=%p", (void *)stream);
}

FAKECUDA_API cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    cudaError_t rc = enter(FN_cudaStreamSynchronize);
    if (!rc)
        rc = do_stream_synchronize(stream);
    return leave(FN_cudaStreamSynchronize, rc, "stream=%p", (void *)stream);
}

FAKECUDA_API cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t stream)
{
    cudaError_t rc = enter(FN_cudaStreamSynchronize_ptsz);
    if (!rc)
        rc = do_stream_synchronize(stream);
    return leave(FN_cudaStreamSynchronize_ptsz, rc, "stream=%p", (void *)stream);
}

FAKECUDA_API cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    cudaError_t rc = enter(FN_cudaStreamQuery);
    if (!rc)
        rc = do_stream_query(stream);
    return leave(FN_cudaStreamQuery, rc, "stream=%p", (void *)stream);
}

FAKECUDA_API cudaError_t cudaEventCreate(cudaEvent_t *event)
{
    cudaError_t rc = enter(FN_cudaEventCreate);
    if (!rc)
        rc = do_event_create(event);
    return leave(FN_cudaEventCreate, rc, "event=%p", rc ? NULL : (void *)*event);
}

FAKECUDA_API cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    cudaError_t rc = enter(FN_cudaEventRecord);
    if (!rc)
        rc = do_event_record(event, stream);
    return leave(FN_cudaEventRecord, rc, "event=%p stream=%p", (void *)event, (void *)stream);
}

FAKECUDA_API cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    cudaError_t rc = enter(FN_cudaEventSynchronize);
    if (!rc)
        rc = do_event_synchronize(event);
    return leave(FN_cudaEventSynchronize, rc, "event=%p", (void *)event);
}

FAKECUDA_API cudaError_t cudaEventQuery(cudaEvent_t event)
{
    cudaError_t rc = enter(FN_cudaEventQuery);
    if (!rc)
        rc = do_event_query(event);
    return leave(FN_cudaEventQuery, rc, "event=%p", (void *)event);
}

FAKECUDA_API cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    cudaError_t rc = enter(FN_cudaEventDestroy);
    if (!rc)
        rc = do_event_destroy(event);
    return leave(FN_cudaEventDestroy, rc, "event=%p", (void *)event);
}

FAKECUDA_API cudaError_t cudaGetLastError(void)
{
    cudaError_t rc;
    bool unlocked = enter_local(FN_cudaGetLastError, &rc);
    rc = tl_last_error;
    tl_last_error = cudaSuccess;
    return leave_local(unlocked, FN_cudaGetLastError, rc, 0, "%s", "");
}

FAKECUDA_API cudaError_t cudaPeekAtLastError(void)
{
    cudaError_t rc;
    bool unlocked = enter_local(FN_cudaPeekAtLastError, &rc);
    return leave_local(unlocked, FN_cudaPeekAtLastError, tl_last_error, 0, "%s", "");
}

FAKECUDA_API const char *cudaGetErrorString(cudaError_t error)
{
    enter(FN_cudaGetErrorString);
    const struct err_desc *d = err_find(error);
    const char *s = d ? d->text : "unrecognized error code";
    leave_quiet(FN_cudaGetErrorString, cudaSuccess, "error=%d \"%s\"", error, s);
    return s;
}

FAKECUDA_API const char *cudaGetErrorName(cudaError_t error)
{
    enter(FN_cudaGetErrorName);
    const struct err_desc *d = err_find(error);
    const char *s = d ? d->name : "unrecognized error code";
    leave_quiet(FN_cudaGetErrorName, cudaSuccess, "error=%d \"%s\"", error, s);
    return s;
}

FAKECUDA_API cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr)
{
    cudaError_t rc = enter(FN_cudaPointerGetAttributes);
    if (!rc)
        rc = do_pointer_attributes(attributes, ptr);
    return leave(FN_cudaPointerGetAttributes, rc, "ptr=%p type=%d device=%d", ptr, rc ? -1 : attributes->type,
                 rc ? -1 : attributes->device);
}

FAKECUDA_API cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, int kind)
{
    cudaError_t rc = enter(FN_cudaMemcpy);
    if (!rc)
        rc = do_memcpy(dst, src, count, kind);
    return leave(FN_cudaMemcpy, rc, "dst=%p src=%p count=%zu kind=%d", dst, src, count, kind);
}

FAKECUDA_API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, int kind, cudaStream_t stream)
{
    cudaError_t rc = enter(FN_cudaMemcpyAsync);
    if (!rc)
        rc = do_memcpy_async(dst, src, count, kind, stream);
    return leave(FN_cudaMemcpyAsync, rc, "dst=%p src=%p count=%zu kind=%d stream=%p", dst, src, count, kind,
                 (void *)stream);
}

FAKECUDA_API cudaError_t cudaMemset(void *devPtr, int value, size_t count)
{
    cudaError_t rc = enter(FN_cudaMemset);
    if (!rc)
        rc = do_memset(devPtr, value, count);
    return leave(FN_cudaMemset, rc, "ptr=%p value=%d count=%zu", devPtr, value, count);
}

FAKECUDA_API cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream)
{
    cudaError_t rc = enter(FN_cudaMemsetAsync);
    if (!rc)
        rc = do_memset_async(devPtr, value, count, stream);
    return leave(FN_cudaMemsetAsync, rc, "ptr=%p value=%d count=%zu stream=%p", devPtr, value, count,
                 (void *)stream);
}

FAKECUDA_API cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream)
{
    cudaError_t rc = enter(FN_cudaMallocAsync);
    if (!rc)
        rc = do_malloc_async(devPtr, size, hStream);
    return leave(FN_cudaMallocAsync, rc, "size=%zu stream=%p ptr=%p", size, (void *)hStream, OUT_PTR(devPtr));
}

FAKECUDA_API cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream)
{
    cudaError_t rc = enter(FN_cudaMallocAsync_ptsz);
    if (!rc)
        rc = do_malloc_async(devPtr, size, hStream);
    return leave(FN_cudaMallocAsync_ptsz, rc, "size=%zu stream=%p ptr=%p", size, (void *)hStream,
                 OUT_PTR(devPtr));
}

FAKECUDA_API cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream)
{
    cudaError_t rc = enter(FN_cudaFreeAsync);
    if (!rc)
        rc = do_free_async(devPtr, hStream);
    return leave(FN_cudaFreeAsync, rc, "ptr=%p stream=%p", devPtr, (void *)hStream);
}

FAKECUDA_API cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream)
{
    cudaError_t rc = enter(FN_cudaFreeAsync_ptsz);
    if (!rc)
        rc = do_free_async(devPtr, hStream);
    return leave(FN_cudaFreeAsync_ptsz, rc, "ptr=%p stream=%p", devPtr, (void *)hStream);
}

FAKECUDA_API cudaError_t cudaMallocHost(void **ptr, size_t size)
{
    cudaError_t rc = enter(FN_cudaMallocHost);
    if (!rc)
        rc = do_malloc_host(ptr, size, cudaHostAllocDefault, AK_HOST);
    return leave(FN_cudaMallocHost, rc, "size=%zu ptr=%p", size, OUT_PTR(ptr));
}

FAKECUDA_API cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
    cudaError_t rc = enter(FN_cudaHostAlloc);
    if (!rc)
        rc = do_malloc_host(pHost, size, flags, AK_HOST);
    return leave(FN_cudaHostAlloc, rc, "size=%zu flags=%u ptr=%p", size, flags, OUT_PTR(pHost));
}

FAKECUDA_API cudaError_t cudaFreeHost(void *ptr)
{
    cudaError_t rc = enter(FN_cudaFreeHost);
    if (!rc)
        rc = do_free_host(ptr);
    return leave(FN_cudaFreeHost, rc, "ptr=%p", ptr);
}

FAKECUDA_API cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags)
{
    cudaError_t rc = enter(FN_cudaMallocManaged);
    if (!rc)
        rc = do_malloc_host(devPtr, size, flags, AK_MANAGED);
    return leave(FN_cudaMallocManaged, rc, "size=%zu flags=%u ptr=%p", size, flags, OUT_PTR(devPtr));
}

FAKECUDA_API cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height)
{
    cudaError_t rc = enter(FN_cudaMallocPitch);
    if (!rc)
        rc = do_malloc_pitch(devPtr, pitch, width, height);
    return leave(FN_cudaMallocPitch, rc, "width=%zu height=%zu pitch=%zu ptr=%p", width, height,
                 rc || !pitch ? 0 : *pitch, OUT_PTR(devPtr));
}

FAKECUDA_API cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr)
{
    cudaError_t rc = enter(FN_cudaIpcGetMemHandle);
    if (!rc)
        rc = do_ipc_get_mem_handle(handle, devPtr);
    return leave(FN_cudaIpcGetMemHandle, rc, "ptr=%p", devPtr);
}

FAKECUDA_API cudaError_t cudaStreamBeginCapture(cudaStream_t stream, fa_cuda_capture_mode mode)
{
    cudaError_t rc = enter(FN_cudaStreamBeginCapture);
    if (!rc)
        rc = do_begin_capture(stream, NULL, mode);
    return leave(FN_cudaStreamBeginCapture, rc, "stream=%p mode=%d", (void *)stream, mode);
}

FAKECUDA_API cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream, fa_cuda_capture_mode mode)
{
    cudaError_t rc = enter(FN_cudaStreamBeginCapture_ptsz);
    if (!rc)
        rc = do_begin_capture(stream, NULL, mode);
    return leave(FN_cudaStreamBeginCapture_ptsz, rc, "stream=%p mode=%d", (void *)stream, mode);
}

/* Dependencies are checked for presence and otherwise ignored: there is no
 * graph to add them to. */
FAKECUDA_API cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t stream, cudaGraph_t graph,
                                                       const cudaGraphNode_t *dependencies,
                                                       const cudaGraphEdgeData *dependencyData,
                                                       size_t numDependencies, fa_cuda_capture_mode mode)
{
    cudaError_t rc = enter(FN_cudaStreamBeginCaptureToGraph);
    (void)dependencyData;
    if (!rc)
        rc = !graph || (numDependencies && !dependencies) ? cudaErrorInvalidValue
                                                           : do_begin_capture(stream, graph, mode);
    return leave(FN_cudaStreamBeginCaptureToGraph, rc, "stream=%p graph=%p mode=%d", (void *)stream,
                 (void *)graph, mode);
}

FAKECUDA_API cudaError_t cudaStreamBeginCaptureToGraph_ptsz(cudaStream_t stream, cudaGraph_t graph,
                                                            const cudaGraphNode_t *dependencies,
                                                            const cudaGraphEdgeData *dependencyData,
                                                            size_t numDependencies, fa_cuda_capture_mode mode)
{
    cudaError_t rc = enter(FN_cudaStreamBeginCaptureToGraph_ptsz);
    (void)dependencyData;
    if (!rc)
        rc = !graph || (numDependencies && !dependencies) ? cudaErrorInvalidValue
                                                           : do_begin_capture(stream, graph, mode);
    return leave(FN_cudaStreamBeginCaptureToGraph_ptsz, rc, "stream=%p graph=%p mode=%d", (void *)stream,
                 (void *)graph, mode);
}

FAKECUDA_API cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph)
{
    cudaError_t rc = enter(FN_cudaStreamEndCapture);
    if (!rc)
        rc = do_end_capture(stream, pGraph);
    return leave(FN_cudaStreamEndCapture, rc, "stream=%p graph=%p", (void *)stream, (void *)OUT_PTR(pGraph));
}

FAKECUDA_API cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t *pGraph)
{
    cudaError_t rc = enter(FN_cudaStreamEndCapture_ptsz);
    if (!rc)
        rc = do_end_capture(stream, pGraph);
    return leave(FN_cudaStreamEndCapture_ptsz, rc, "stream=%p graph=%p", (void *)stream, (void *)OUT_PTR(pGraph));
}

FAKECUDA_API cudaError_t cudaStreamGetDevice(cudaStream_t stream, int *device)
{
    cudaError_t rc = enter(FN_cudaStreamGetDevice);
    if (!rc)
        rc = do_stream_get_device(stream, device);
    return leave(FN_cudaStreamGetDevice, rc, "stream=%p device=%d", (void *)stream, rc ? -1 : *device);
}

FAKECUDA_API cudaError_t cudaStreamIsCapturing(cudaStream_t stream, int *pCaptureStatus)
{
    cudaError_t rc = enter(FN_cudaStreamIsCapturing);
    if (!rc)
        rc = do_is_capturing(stream, pCaptureStatus);
    return leave(FN_cudaStreamIsCapturing, rc, "stream=%p status=%d", (void *)stream, rc ? -1 : *pCaptureStatus);
}

FAKECUDA_API cudaError_t cudaThreadExchangeStreamCaptureMode(fa_cuda_capture_mode *mode)
{
    cudaError_t rc = enter(FN_cudaThreadExchangeStreamCaptureMode);
    if (!rc)
        rc = do_exchange_capture_mode(mode);
    return leave(FN_cudaThreadExchangeStreamCaptureMode, rc, "old=%d now=%d", rc ? -1 : *mode, tl_capture_mode);
}

FAKECUDA_API cudaError_t cudaRuntimeGetVersion(int *runtimeVersion)
{
    enter(FN_cudaRuntimeGetVersion);
    if (runtimeVersion)
        *runtimeVersion = FC_VERSION;
    return leave(FN_cudaRuntimeGetVersion, runtimeVersion ? cudaSuccess : cudaErrorInvalidValue, "version=%d",
                 FC_VERSION);
}

FAKECUDA_API cudaError_t cudaDriverGetVersion(int *driverVersion)
{
    enter(FN_cudaDriverGetVersion);
    if (driverVersion)
        *driverVersion = FC_VERSION;
    return leave(FN_cudaDriverGetVersion, driverVersion ? cudaSuccess : cudaErrorInvalidValue, "version=%d",
                 FC_VERSION);
}

/* ---- test hooks ------------------------------------------------------------------------- */

FAKECUDA_API int fakecuda_enqueue_fault(cudaStream_t h)
{
    lock();
    struct CUstream_st *s;
    cudaError_t rc = g.forked_child ? cudaErrorInitializationError : sticky_for(FN_cudaMalloc);
    if (!rc)
        rc = resolve_stream(h, &s);
    if (!rc) {
        const struct op o = {.kind = OP_FAULT};
        uint64_t seq;
        rc = enqueue(s, h, &o, &seq);
    }
    if (rc)
        tl_last_error = rc;
    unlock();
    return rc;
}

FAKECUDA_API int fakecuda_enqueue_fill(cudaStream_t s, void *dst, int byte, size_t len)
{
    lock();
    cudaError_t rc = g.forked_child ? cudaErrorInitializationError : sticky_for(FN_cudaMalloc);
    if (!rc)
        rc = do_enqueue_fill(s, dst, byte, len);
    if (rc)
        tl_last_error = rc;
    unlock();
    return rc;
}

FAKECUDA_API unsigned long fakecuda_calls(const char *fn)
{
    for (int i = 0; fn && i < FN_COUNT; i++) {
        if (strcmp(fn_names[i], fn) != 0)
            continue;
        unsigned long sum = 0;
        for (int t = 0; t < FC_CALL_SLOTS; t++)
            sum += __atomic_load_n(&fn_calls[t].n[i], __ATOMIC_RELAXED);
        return sum;
    }
    return 0;
}

FAKECUDA_API void fakecuda_reset_counters(void)
{
    for (int t = 0; t < FC_CALL_SLOTS; t++)
        for (int i = 0; i < FN_COUNT; i++)
            __atomic_store_n(&fn_calls[t].n[i], 0, __ATOMIC_RELAXED);
}

FAKECUDA_API size_t fakecuda_used(int device)
{
    lock();
    if (device < 0 || device >= g.ndev)
        hook_misuse("fakecuda_used", device);
    size_t n = g.dev[device].used;
    unlock();
    return n;
}

FAKECUDA_API size_t fakecuda_pending(int device)
{
    lock();
    if (device < 0 || device >= g.ndev)
        hook_misuse("fakecuda_pending", device);
    size_t n = pending_on(device);
    unlock();
    return n;
}

FAKECUDA_API void fakecuda_set_capacity(int device, size_t bytes)
{
    lock();
    if (device < 0 || device >= g.ndev)
        hook_misuse("fakecuda_set_capacity", device);
    struct device *d = &g.dev[device];
    if (d->base && bytes > d->mapped) {
        /* The region must move to grow: only possible with nothing in it. */
        if (d->allocs || pending_anywhere()) {
            say("fakecuda: fakecuda_set_capacity: device %d cannot grow to %zu bytes beyond its %zu mapped bytes "
                "while it has allocations or work is queued; set the capacity before first use",
                device, bytes, d->mapped);
            abort();
        }
        munmap(d->base, d->mapped + page_size());
        d->base = NULL;
        d->mapped = 0;
    }
    d->capacity = bytes;
    unlock();
}

FAKECUDA_API int fakecuda_device_of(const void *p)
{
    lock();
    struct alloc *a = device_alloc_at(p);
    int dev = a ? a->device : -1;
    unlock();
    return dev;
}

/* ---- the driver functions (reached through the entry points only) ------------------------ */

/* The driver's code for a runtime error the implementations return (the
 * two numberings agree for these). */
static int cu_result(cudaError_t e)
{
    return e == cudaErrorMemoryAllocation ? CU_OOM : e == cudaErrorInitializationError ? 3 : (int)e;
}

static cudaError_t entry_point(const char *sym, void **fn, fa_cuda_entry_status *st);

#define FC_DRIVER(name, params, call, fmt, ...)                              \
    static fa_cu_result fc_##name params                                     \
    {                                                                        \
        int rc = enter(FN_##name);                                           \
        if (!rc)                                                             \
            rc = call;                                                       \
        rc = leave_quiet(FN_##name, rc, fmt, __VA_ARGS__);                   \
        slow_return(FN_##name);                                              \
        return rc;                                                           \
    }
FC_DRIVER(cuDeviceGetAttribute, (int *v, fa_cu_attr a, int dev), do_cu_get_attribute(v, a, dev), "attr=%d dev=%d",
          (int)a, dev)
FC_DRIVER(cuMemGetAllocationGranularity, (size_t *gr, const fa_cu_alloc_prop *p, fa_cu_gran_flags f),
          do_cu_granularity(gr, p, f), "flags=%d", (int)f)
FC_DRIVER(cuMemAddressReserve, (fa_cu_ptr *p, size_t size, size_t align, fa_cu_ptr addr, unsigned long long f),
          ((void)addr, do_cu_reserve(p, size, align, f)), "size=%zu align=%zu", size, align)
FC_DRIVER(cuMemAddressFree, (fa_cu_ptr p, size_t size), do_cu_address_free(p, size), "ptr=%llx size=%zu", p, size)
FC_DRIVER(cuMemCreate, (fa_cu_handle *h, size_t size, const fa_cu_alloc_prop *p, unsigned long long f),
          do_cu_create(h, size, p, f), "size=%zu", size)
FC_DRIVER(cuMemRelease, (fa_cu_handle h), do_cu_release(h), "handle=%llx", h)
FC_DRIVER(cuMemMap, (fa_cu_ptr p, size_t size, size_t off, fa_cu_handle h, unsigned long long f),
          do_cu_map(p, size, off, h, f), "ptr=%llx size=%zu handle=%llx", p, size, h)
FC_DRIVER(cuMemUnmap, (fa_cu_ptr p, size_t size), do_cu_unmap(p, size), "ptr=%llx size=%zu", p, size)
FC_DRIVER(cuMemSetAccess, (fa_cu_ptr p, size_t size, const fa_cu_access_desc *d, size_t n),
          do_cu_set_access(p, size, d, n), "ptr=%llx size=%zu n=%zu", p, size, n)
FC_DRIVER(cuMemGetAddressRange, (fa_cu_ptr *base, size_t *size, fa_cu_ptr p), do_cu_address_range(base, size, p),
          "ptr=%llx", p)
FC_DRIVER(cuMemAlloc, (fa_cu_ptr *p, size_t size), cu_result(do_malloc((void **)p, size)), "size=%zu", size)
FC_DRIVER(cuMemFree, (fa_cu_ptr p), cu_result(do_free((void *)(uintptr_t)p)), "ptr=%llx", p)
FC_DRIVER(cuMemAllocAsync, (fa_cu_ptr *p, size_t size, cudaStream_t s), cu_result(do_malloc_async((void **)p, size, s)),
          "size=%zu stream=%p", size, (void *)s)
FC_DRIVER(cuGetProcAddress, (const char *sym, void **fn, int version, fa_cu_u64 flags, fa_cu_proc_status *st),
          cu_result(flags > 2 || version < 10020 ? cudaErrorInvalidValue : entry_point(sym, fn, st)), "symbol=%s",
          sym ? sym : "(null)")
#undef FC_DRIVER

static const struct {
    const char *name;
    void *fn;
} driver_entries[] = {
#define X(name) {#name, (void *)fc_##name},
    FAKECUDA_DRIVER_FUNCS(X)
#undef X
};

static cudaError_t entry_point(const char *sym, void **fn, fa_cuda_entry_status *st)
{
    if (!sym || !fn)
        return cudaErrorInvalidValue;
    *fn = NULL;
    for (size_t i = 0; g.vmm >= 0 && i < sizeof driver_entries / sizeof driver_entries[0]; i++)
        if (strcmp(driver_entries[i].name, sym) == 0)
            *fn = driver_entries[i].fn;
    if (st)
        *st = *fn ? 0 : 1; /* cudaDriverEntryPointSuccess, cudaDriverEntryPointSymbolNotFound */
    return cudaSuccess;
}

FAKECUDA_API void *fakecuda_driver_function(const char *name)
{
    void *fn = NULL;
    for (size_t i = 0; name && i < sizeof driver_entries / sizeof driver_entries[0]; i++)
        if (strcmp(driver_entries[i].name, name) == 0)
            fn = driver_entries[i].fn;
    return fn;
}

FAKECUDA_API cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **funcPtr, unsigned long long flags,
                                                 fa_cuda_entry_status *driverStatus)
{
    enter(FN_cudaGetDriverEntryPoint);
    cudaError_t rc = flags > 2 ? cudaErrorInvalidValue : entry_point(symbol, funcPtr, driverStatus);
    return leave(FN_cudaGetDriverEntryPoint, rc, "symbol=%s", symbol ? symbol : "(null)");
}

FAKECUDA_API cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr, unsigned int cudaVersion,
                                                          unsigned long long flags, fa_cuda_entry_status *driverStatus)
{
    enter(FN_cudaGetDriverEntryPointByVersion);
    cudaError_t rc = flags > 2 || cudaVersion < 10020 ? cudaErrorInvalidValue
                                                      : entry_point(symbol, funcPtr, driverStatus);
    return leave(FN_cudaGetDriverEntryPointByVersion, rc, "symbol=%s version=%u", symbol ? symbol : "(null)",
                 cudaVersion);
}

FAKECUDA_API cudaError_t cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags)
{
    cudaError_t rc = enter(FN_cudaDeviceEnablePeerAccess);
    if (!rc)
        rc = do_enable_peer_access(peerDevice, flags);
    return leave(FN_cudaDeviceEnablePeerAccess, rc, "peer=%d", peerDevice);
}

FAKECUDA_API unsigned long fakecuda_stale_stream_uses(void)
{
    lock();
    unsigned long n = g.stale_stream_uses;
    unlock();
    return n;
}

FAKECUDA_API unsigned long fakecuda_faults(int device)
{
    lock();
    if (device < 0 || device >= g.ndev)
        hook_misuse("fakecuda_faults", device);
    unsigned long n = g.dev[device].faults;
    unlock();
    return n;
}

FAKECUDA_API void fakecuda_set_sync_error(int err)
{
    lock();
    g.sync_error = (cudaError_t)err;
    unlock();
}

FAKECUDA_API void fakecuda_set_busy_sync_ms(unsigned ms)
{
    lock();
    g.busy_sync_ms = ms;
    unlock();
}

FAKECUDA_API void fakecuda_set_entry_hook(const char *fn, void (*hook)(void))
{
    int which = -1;
    for (int i = 0; fn && i < FN_COUNT; i++)
        if (strcmp(fn_names[i], fn) == 0)
            which = i;
    if (which < 0) {
        say("fakecuda: fakecuda_set_entry_hook: no function %s", fn ? fn : "(null)");
        abort();
    }
    __atomic_store_n(&g.entry_hook, hook, __ATOMIC_RELEASE);
    __atomic_store_n(&g.entry_hook_fn, which, __ATOMIC_RELEASE);
}

FAKECUDA_API size_t fakecuda_pieces(int device)
{
    lock();
    if (device < 0 || device >= g.ndev)
        hook_misuse("fakecuda_pieces", device);
    size_t n = 0;
    for (struct vm_piece *pc = g.pieces; pc; pc = pc->next)
        n += pc->device == device ? pc->size : 0;
    unlock();
    return n;
}

FAKECUDA_API int fakecuda_rdma_capable(const void *p)
{
    lock();
    struct vm_mapping *m = mapping_at(p);
    int yes = m ? m->piece->rdma : device_alloc_at(p) != NULL;
    unlock();
    return yes;
}

FAKECUDA_API size_t fakecuda_mapped(int device)
{
    lock();
    if (device < 0 || device >= g.ndev)
        hook_misuse("fakecuda_mapped", device);
    size_t n = 0;
    for (struct vm_mapping *m = g.mappings; m; m = m->next)
        n += m->piece->device == device ? m->size : 0;
    unlock();
    return n;
}
