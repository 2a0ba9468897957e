/* snapshot.h - one plain struct holding every number a report shows.
 *
 * Reports are made in two steps, as google/tcmalloc does: fill a snapshot
 * (host.c, device/pool.c and the registry each fill their part), then render
 * it (render.c) as text, JSON or Prometheus.  Renderers never call into the
 * allocators and read no live setting (the snapshot carries the settings),
 * so they are testable with a hand-made snapshot. */
#ifndef FA_SNAPSHOT_H
#define FA_SNAPSHOT_H

#include <stdbool.h>
#include <stdint.h>

#include "../core/options.h"
#include "stats.h"

/* tcmalloc numeric properties: JSON key host.tcmalloc.<key>, property name. */
#define FA_TCMALLOC_PROPS(X)                                                 \
    X(current_allocated_bytes, "generic.current_allocated_bytes")            \
    X(heap_size, "generic.heap_size")                                        \
    X(pageheap_free_bytes, "tcmalloc.pageheap_free_bytes")                   \
    X(pageheap_unmapped_bytes, "tcmalloc.pageheap_unmapped_bytes")           \
    X(central_cache_free_bytes, "tcmalloc.central_cache_free_bytes")         \
    X(transfer_cache_free_bytes, "tcmalloc.transfer_cache_free_bytes")       \
    X(thread_cache_free_bytes, "tcmalloc.thread_cache_free_bytes")           \
    X(max_total_thread_cache_bytes, "tcmalloc.max_total_thread_cache_bytes")

enum fa_tc_prop {
#define FA_TC_ENUM(key, prop) FA_TC_##key,
    FA_TCMALLOC_PROPS(FA_TC_ENUM)
#undef FA_TC_ENUM
    FA_TC_COUNT
};
extern const char *const fa_tc_keys[FA_TC_COUNT];
extern const char *const fa_tc_props[FA_TC_COUNT];

/* Why forgealloc returned free host memory to the OS, with the meaning of
 * host.release.<reason>_bytes.  X(reason, doc, arg): `arg` is the second
 * argument of FA_RELEASE_REASONS, passed through (FA_HOST_FIELDS passes its
 * own X there to make a host row of each reason). */
#define FA_RELEASE_REASONS(X, arg)                                                                           \
    X(delay, "free memory that stayed unused for FORGEALLOC_RELEASE_DELAY (also while the program idles)", arg) \
    X(threshold, "returned at once past FORGEALLOC_RELEASE_THRESHOLD (FORGEALLOC_RELEASE_DELAY=0)", arg)        \
    X(pressure, "returned at once because the memory cgroup or the machine ran short", arg)                    \
    X(request, "returned on request: malloc_trim, forgealloc_release", arg)

enum fa_release_reason {
#define FA_REL_ENUM(name, doc, arg) FA_REL_##name,
    FA_RELEASE_REASONS(FA_REL_ENUM, )
#undef FA_REL_ENUM
    FA_REL_COUNT
};

/* Kinds and Prometheus exposure of FA_HOST_FIELDS rows. */
enum fa_field_kind {
    FA_COUNTER, /* only grows */
    FA_GAUGE,   /* goes up and down */
    FA_FLAG,    /* true or false: JSON true/false, 0/1 for forgealloc_stat and Prometheus */
};
enum fa_field_metric {
    FA_NO_METRIC, /* not a Prometheus metric of its own */
    FA_METRIC,    /* a Prometheus metric of its own (FA_HOST_FIELDS says its name) */
};

/* The host numbers of one value each, in the order of the JSON "host"
 * object (after "calls"): every row is a JSON key host.<key>, the
 * forgealloc_stat key of the same name and, where `metric` says so, the
 * Prometheus metric forgealloc_host_<key> (the dot as an underscore, and
 * _total after a counter's name).  A dot in `key` names the object the
 * number sits in; the rows of one object are adjacent.
 *
 * X(key, kind, metric, shown, value, doc)
 *   kind    enum fa_field_kind
 *   metric  enum fa_field_metric; bytes_requested is the _sum of the size
 *           histogram and held_free_bytes is tcmalloc_pageheap_free_bytes,
 *           so neither is a metric of its own
 *   shown   whether the number exists in this snapshot (a key that does
 *           not is left out of the JSON and unknown to forgealloc_stat),
 *           an expression of the fa_snapshot `s`
 *   value   the number, an expression of the fa_snapshot `s`
 *   doc     its meaning (the metric's HELP)
 *
 * Who serves malloc (host.interposed, host.served_by: a flag with a path
 * that Prometheus shows as a label), the calls, the size histogram and
 * tcmalloc's numbers have tables and renderings of their own.
 * tests/check_stats_json.py reads its list of host keys from this table, and
 * tests/check_docs.py makes the key tables of docs/stats.md from it. */
#define FA_HOST_FIELDS(X)                                                                                      \
    X("bytes_requested", FA_COUNTER, FA_NO_METRIC, 1, s->host.bytes_requested,                                  \
      "bytes requested by allocating calls (calloc: n*size; calls refused for their arguments: none)")           \
    X("large_allocs", FA_COUNTER, FA_METRIC, 1, s->host.large_allocs,                                           \
      "allocations at or above the large-allocation threshold")                                                  \
    X("rss_bytes", FA_GAUGE, FA_METRIC, 1, s->rss_bytes, "resident set size")                                   \
    X("peak_rss_bytes", FA_GAUGE, FA_METRIC, 1, s->peak_rss_bytes, "peak resident set size")                    \
    X("releases", FA_COUNTER, FA_METRIC, 1, s->releases, "returns of free memory to the OS made by forgealloc")  \
    X("released_bytes", FA_COUNTER, FA_METRIC, 1, s->released_bytes, "bytes forgealloc returned to the OS")      \
    FA_RELEASE_REASONS(FA_HOST_RELEASE_ROW, X)                                                                   \
    X("release.held_free_bytes", FA_GAUGE, FA_NO_METRIC, s->tc_valid, s->tc[FA_TC_pageheap_free_bytes],         \
      "free memory tcmalloc's page heap holds now (shown when tcmalloc's numbers are known)")                    \
    X("release.hold_ms", FA_GAUGE, FA_METRIC, 1, s->release_hold_ms,                                            \
      "free memory unused this long while no large allocation is made goes back to the OS")                      \
    X("release.background", FA_FLAG, FA_NO_METRIC, 1, s->release_background,                                    \
      "the background thread runs the release policy")                                                           \
    X("grown_bytes", FA_GAUGE, FA_METRIC, 1, s->grown_bytes,                                                      \
      "blocks realloc grew past 4 MiB, in mappings of their own (resized with mremap, unmapped at free)")          \
    X("thread_records", FA_COUNTER, FA_NO_METRIC, 1, s->stat_records,                                           \
      "per-thread count records ever made (bounded by the peak number of live threads)")

/* A release reason as a row of FA_HOST_FIELDS: host.release.<reason>_bytes. */
#define FA_HOST_RELEASE_ROW(name, doc, X) \
    X("release." #name "_bytes", FA_COUNTER, FA_METRIC, 1, s->released_by[FA_REL_##name], doc)

/* Per-device numbers: JSON keys of device.devices[] (docs/stats.md lists them), unit and
 * meaning.  allocs = pool_allocs + fallback_allocs. */
#define FA_DEVICE_FIELDS(X)                                                                          \
    X(pool_bytes, "bytes", "memory reserved from the driver for the pool")                           \
    X(pool_chunks, "chunks", "chunks the pool is made of")                                            \
    X(in_use_bytes, "bytes", "bytes of live cudaMalloc allocations (pool and driver)")               \
    X(peak_in_use_bytes, "bytes", "highest in_use_bytes")                                            \
    X(pool_in_use_bytes, "bytes", "bytes of the pool taken by live allocations, rounding included") \
    X(quarantine_bytes, "bytes", "freed pool blocks waiting for the device to finish queued work")  \
    X(allocs, "count", "successful cudaMalloc calls")                                                \
    X(frees, "count", "successful cudaFree calls of memory from cudaMalloc")                         \
    X(pool_allocs, "count", "allocations served from the pool")                                      \
    X(fallback_allocs, "count", "allocations passed to the driver (too large, pool full, blind)")   \
    X(failed_allocs, "count", "cudaMalloc calls that failed with the driver's error")                \
    X(driver_malloc_calls, "count", "cudaMalloc calls made to the driver")                          \
    X(driver_free_calls, "count", "cudaFree calls made to the driver")                              \
    X(driver_ns, "ns", "time spent inside driver cudaMalloc, cudaFree and synchronisation")         \
    X(device_syncs, "count", "device synchronisations forgealloc made to reuse quarantined blocks") \
    X(chunks_returned, "count", "pool chunks given back to the driver to satisfy a request")         \
    X(waste_bytes, "bytes", "pool bytes taken beyond what live allocations requested")               \
    X(peak_waste_bytes, "bytes", "highest waste_bytes")                                              \
    X(requested_bytes, "bytes", "bytes requested by live pool allocations")                        \
    X(vmm, "bool", "1: the pool maps physical pieces into reserved address space; 0: chunks from cudaMalloc") \
    X(pieces_mapped, "pieces", "physical pieces mapped in the pool (pool_bytes in all)")             \
    X(pieces_idle, "pieces", "mapped pieces holding no live or quarantined block")                   \
    X(idle_bytes, "bytes", "bytes of idle pieces, or of chunks holding no live block: counted free by cudaMemGetInfo, given back first") \
    X(pieces_created, "count", "physical pieces created (cuMemCreate)")                               \
    X(pieces_reused, "count", "idle pieces moved to back other addresses instead of creating new ones") \
    X(pieces_released, "count", "idle pieces released at once because the driver ran short")          \
    X(pieces_grown, "count", "pieces created while the pool held FORGEALLOC_DEVICE_POOL_SIZE or more") \
    X(pieces_given_back, "count", "pieces beyond FORGEALLOC_DEVICE_POOL_SIZE released after 10 s without growth") \
    X(driver_vm_calls, "count", "cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap and cuMemRelease calls") \
    X(largest_free_bytes, "bytes", "largest block the pool's address space could place now (piece pool)")

typedef struct fa_device_stats {
    int device;
#define FA_DEV_FIELD(name, unit, doc) uint64_t name;
    FA_DEVICE_FIELDS(FA_DEV_FIELD)
#undef FA_DEV_FIELD
} fa_device_stats;

/* CUDA calls that are counted and passed through: device.passthrough.<name>. */
#define FA_CUDA_PASSTHROUGH(X) \
    X(cudaMallocAsync) X(cudaFreeAsync) X(cudaMallocHost) X(cudaHostAlloc) X(cudaFreeHost) X(cudaMallocManaged) X(cudaMallocPitch) \
    X(cuMemAlloc) X(cuMemCreate) X(cuMemAllocAsync)

enum fa_cuda_pt {
#define FA_PT_ENUM(name) FA_PT_##name,
    FA_CUDA_PASSTHROUGH(FA_PT_ENUM)
#undef FA_PT_ENUM
    FA_PT_COUNT
};
extern const char *const fa_pt_names[FA_PT_COUNT];

#define FA_MAX_DEVICES 16

/* Who serves malloc for the process: the definition the global symbol
 * lookup finds, decided once at start. */
enum fa_malloc_server {
    FA_SERVER_SELF,          /* forgealloc: every call counted */
    FA_SERVER_SAME_TCMALLOC, /* the tcmalloc forgealloc calls, ahead of it: its numbers are the process's */
    FA_SERVER_OTHER,         /* another allocator (jemalloc, glibc, ...): tcmalloc's numbers are not */
};

typedef struct fa_snapshot {
    /* process */
    int pid, ppid;
    bool forked;        /* this process was forked from one under the shim */
    char exe[512];
    const char *reason; /* "exit", "signal", "interval", "request" */
    uint64_t time_unix_ms;
    uint64_t uptime_ms;
    /* the settings in effect when the snapshot was taken (fa_options_copy):
     * the JSON config object, the thresholds the text names */
    fa_optval settings[FA_OPT_COUNT];
    /* host */
    fa_host_counts host;
    uint64_t rss_bytes, peak_rss_bytes;
    uint64_t releases, released_bytes; /* returns to the OS made by forgealloc */
    uint64_t released_by[FA_REL_COUNT]; /* released_bytes by reason */
    bool release_background;            /* the background thread runs the policy */
    uint64_t release_hold_ms;           /* free memory unused this long goes back (0: at once) */
    uint64_t grown_bytes;               /* mappings of blocks realloc grew (grown.h) */
    bool in_signal;     /* taken in a signal handler: tcmalloc is not called */
    bool tc_valid;      /* false when no copy of tcmalloc's numbers was available */
    uint64_t tc_age_ms; /* age of that copy (0: read now) */
    uint64_t tc[FA_TC_COUNT];
    double release_rate; /* read back from tcmalloc; negative if unreadable */
    uint64_t stat_records;
    /* device */
    bool cuda_seen;     /* some CUDA call reached the shim */
    bool device_blind;
    const char *blind_reason;
    uint64_t passthrough[FA_PT_COUNT];
    int ndevices;
    fa_device_stats dev[FA_MAX_DEVICES];
    /* who serves malloc (zero: forgealloc, path unknown) */
    enum fa_malloc_server malloc_server;
    const char *served_by; /* path of the library that serves malloc; NULL or "" if unknown */
} fa_snapshot;

#endif
