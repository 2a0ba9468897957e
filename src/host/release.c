/* release.c - the release policy described in release.h. */
#include "release.h"

#include <errno.h>
#include <sched.h>
#include <time.h>
#include <gperftools/malloc_extension_c.h>
#include <gperftools/tcmalloc.h>
#include <stdbool.h>
#include <string.h>
#include <sys/mman.h>

#include "../core/log.h"
#include "../core/options.h"
#include "../core/owner.h"
#include "decay.h"
#include "pressure.h"
#include "tcprop.h"

/* Live large blocks, by address: open-addressing tables with short probes,
 * written with compare-and-swap (large allocations are rare).  The first
 * table is small, so a process with a few hundred large blocks keeps 64 KiB
 * of it resident, not a page per block; a block whose probes find it full
 * goes to the second, mapped when that first happens.  A block that finds
 * no slot in either is counted in `untracked`; while that is non-zero,
 * page-aligned frees that miss the tables ask tcmalloc. */
#define LEVELS 2
static const unsigned level_bits[LEVELS] = {12, 16};
#define PROBES 8
typedef struct {
    uintptr_t p;
    size_t n;
} large_slot;
static large_slot *tables[LEVELS];
static uint64_t untracked;
int fa_release_seen_large;

static size_t slot_of(uintptr_t p, unsigned bits) { return (size_t)((p >> 12) * 0x9E3779B97F4A7C15ull >> (64 - bits)); }

static large_slot *get_table(int level)
{
    large_slot *t = __atomic_load_n(&tables[level], __ATOMIC_ACQUIRE);
    if (t)
        return t;
    size_t bytes = ((size_t)1 << level_bits[level]) * sizeof *t;
    int saved = errno; /* a malloc that succeeded leaves errno as it was */
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
        errno = saved;
        return NULL;
    }
    large_slot *expect = NULL;
    if (!__atomic_compare_exchange_n(&tables[level], &expect, (large_slot *)m, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE)) {
        munmap(m, bytes); /* another thread won */
        errno = saved;
        return expect;
    }
    return (large_slot *)m;
}

static bool insert(void *p, size_t n)
{
    if (!__atomic_load_n(&fa_release_seen_large, __ATOMIC_RELAXED)) /* no store to a line all threads read */
        __atomic_store_n(&fa_release_seen_large, 1, __ATOMIC_RELAXED);
    for (int level = 0; level < LEVELS; level++) {
        large_slot *t = get_table(level);
        if (!t)
            break;
        size_t mask = ((size_t)1 << level_bits[level]) - 1, i = slot_of((uintptr_t)p, level_bits[level]);
        for (int k = 0; k < PROBES; k++, i = (i + 1) & mask) {
            uintptr_t empty = 0;
            if (__atomic_compare_exchange_n(&t[i].p, &empty, (uintptr_t)p, false, __ATOMIC_ACQ_REL,
                                            __ATOMIC_RELAXED)) {
                __atomic_store_n(&t[i].n, n, __ATOMIC_RELEASE);
                return true;
            }
        }
    }
    return false;
}

static void remember(void *p, size_t n)
{
    if (!insert(p, n))
        __atomic_fetch_add(&untracked, 1, __ATOMIC_RELAXED);
}

void fa_release_remember(void *p, size_t n) { remember(p, n); }

bool fa_release_remember_mapped(void *p, size_t n) { return insert(p, n | FA_RELEASE_MAPPED); }

/* The slot holding p, or NULL. */
static large_slot *find(const void *p)
{
    for (int level = 0; level < LEVELS; level++) {
        large_slot *t = __atomic_load_n(&tables[level], __ATOMIC_ACQUIRE);
        if (!t)
            break; /* a level is mapped only after the one before it */
        size_t mask = ((size_t)1 << level_bits[level]) - 1, i = slot_of((uintptr_t)p, level_bits[level]);
        for (int k = 0; k < PROBES; k++, i = (i + 1) & mask)
            if (__atomic_load_n(&t[i].p, __ATOMIC_ACQUIRE) == (uintptr_t)p)
                return &t[i];
    }
    return NULL;
}

size_t fa_release_lookup(const void *p)
{
    large_slot *s = find(p);
    return s ? __atomic_load_n(&s->n, __ATOMIC_ACQUIRE) : 0;
}

bool fa_release_resize(const void *p, size_t n)
{
    large_slot *s = find(p);
    if (s)
        __atomic_store_n(&s->n, n, __ATOMIC_RELEASE);
    return s != NULL;
}

size_t fa_release_forget(void *p)
{
    large_slot *s = find(p);
    if (s) {
        size_t n = __atomic_load_n(&s->n, __ATOMIC_ACQUIRE);
        __atomic_store_n(&s->p, 0, __ATOMIC_RELEASE); /* a block is freed once */
        return n;
    }
    if (__atomic_load_n(&untracked, __ATOMIC_RELAXED) == 0)
        return 0;
    size_t n = tc_malloc_size(p); /* rare: the tables were full around p */
    if (n < FA_RELEASE_MIN)
        return 0;
    /* Take one from the count, never below zero: of two frees that both saw
     * the last one, only one has it. */
    uint64_t left = __atomic_load_n(&untracked, __ATOMIC_RELAXED);
    do {
        if (left == 0)
            return 0;
    } while (!__atomic_compare_exchange_n(&untracked, &left, left - 1, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return n;
}

size_t fa_release_table_bytes(void)
{
    size_t bytes = 0;
    for (int level = 0; level < LEVELS; level++)
        if (__atomic_load_n(&tables[level], __ATOMIC_ACQUIRE))
            bytes += ((size_t)1 << level_bits[level]) * sizeof(large_slot);
    return bytes;
}

uint64_t fa_release_untracked(void) { return __atomic_load_n(&untracked, __ATOMIC_RELAXED); }

/* ---- the policy ------------------------------------------------------------ */

static int busy; /* a release is being decided */
static uint64_t releases, by_reason[FA_REL_COUNT];

/* What every large allocation and free reads or writes, on one cache line
 * of its own: threads that churn large blocks pass one line between them,
 * not five.
 *
 * shrink: net bytes of large blocks freed since the background last
 * looked (never negative): what wakes it.  With FORGEALLOC_RELEASE_DELAY=0
 * it is the whole policy: past the threshold, return free memory at once.
 *
 * read_free, read_unused, moved: tcmalloc's free bytes and its free plus
 * returned bytes as last read (at read_ms), and the large blocks freed
 * minus those allocated since (bytes).  Reading a property costs about 270
 * instructions and tcmalloc's page-heap lock, more than a large malloc and
 * free take together, so allocations read them at most once per tick of
 * the coarse clock (1-4 ms); in between, a sample is the last reading
 * moved by the large blocks since.  That is exact for them and misses only
 * tcmalloc's own small-object spans; where a block grew the heap instead
 * of taking free memory, it reads low, which keeps memory, never returns
 * it.  Ticks read them always.
 *
 * sampled_ms, sampled_min, sampled_min_unused: the tick of the coarse
 * clock in which the allocations' samples were last recorded, and the
 * lowest recorded in it.  A later sample in that tick that is no lower
 * changes nothing the windows keep (a slot's minimum; a fall ends at the
 * lowest sample), so it is not recorded: no lock, no store.
 *
 * last_alloc_ms, prev_alloc_ms: the two latest large allocations. */
static struct {
    uint64_t shrink;
    int64_t moved;
    uint64_t read_free, read_unused, read_ms;
    uint64_t sampled_ms, sampled_min, sampled_min_unused;
    uint64_t last_alloc_ms, prev_alloc_ms;
} hot __attribute__((aligned(64)));

/* A thread's large frees minus its large allocations (bytes) not yet added
 * to hot.shrink and hot.moved: a thread that allocates and frees large
 * blocks in turn (a buffer per step) would otherwise make four atomic
 * additions to the shared line per block, each a round trip between cores
 * and, after tcmalloc's own stores, a wait for them to drain.  The balance
 * is published once it reaches BATCH bytes either way (less with a small
 * threshold: an eighth of it, none at 0), so the policy sees every thread's
 * blocks at most BATCH late; a thread that exits leaves at most that
 * unseen, which the tick's own reading of tcmalloc covers. */
#define BATCH ((int64_t)4 << 20)
static __thread int64_t unpublished __attribute__((tls_model("initial-exec")));

/* The window of free-memory minima.  Samplers on the allocating path only
 * try the lock: a sample lost to a tick in progress is covered by the
 * tick's own sample. */
static fa_decay decay;
static int decay_lock, decay_ready;
/* How long free memory must stay unused before it goes back, in units of
 * the delay, learnt from regret: a factor grows whenever what a release
 * returned is committed again before the release is judged (the program
 * needed it: each page came back as a page fault), and halves after a
 * release that was not regretted.  Only memory committed again counts:
 * tcmalloc also commits when it grows its heap, which is new demand, not
 * the return coming back.
 *
 * While large allocations go on (busy), memory counts as unused only after
 * the busy factor (at least 4) times the delay, and the idle window too
 * (whichever is longer): in a churning heap, free
 * spans that sat out one window are still picked again later (tcmalloc
 * takes the best fit among free and returned spans alike).  A busy release
 * is judged over one window; a regret doubles the factor.
 *
 * While they do not (idle), the idle factor (at least 1) stretches both the
 * window and the quiet time.  A WebUI that moves its text encoder to the
 * host for each prompt and frees it while the GPU generates looks idle
 * between prompts, and a person types the next prompt a minute later: an
 * idle release is judged over IDLE_MAX delays (256 s with the default
 * 2 s), and a regret stretches the window past the idle spell it cut short
 * (from the last allocation before the release to the first one after), so
 * the next spell like it keeps its memory; one return per kind of spell,
 * not one per prompt.  The idle window is at most IDLE_MAX delays, the
 * quiet time one delay more, and memory pressure takes back what the
 * windows say the program will not need, whatever the hold.
 *
 * An idle release is judged lazily, at the first look after the program
 * came back (its next frees wake the background thread): the spell's end
 * says whether it came back within the horizon.  A process that settled
 * keeps no thread for minutes to judge a return nobody may ever regret. */
typedef struct {
    unsigned factor, min, max;
    uint64_t released, recommitted, until_ms;
} learner;
#define BUSY_MIN 4
#define BUSY_MAX 256
#define IDLE_MAX 128
static learner busy_l = {BUSY_MIN, BUSY_MIN, BUSY_MAX, 0, 0, 0};
static learner idle_l = {1, 1, IDLE_MAX, 0, 0, 0};
static fa_decay active; /* the busy window; `decay` is the idle one */
static uint64_t last_commit, last_reserve; /* tcmalloc's commit and reserve counters at the last tick */
/* The idle spell an idle release cut into: from the last large allocation
 * before it to the first one after it (0: none yet). */
static uint64_t spell_begin_ms, spell_end_ms;
/* No background thread: the next call that may run the policy itself. */
static uint64_t inline_due_ms;
/* Who runs the policy: nobody yet (no large free memory was held), the
 * background thread, or, where no thread can run, the allocator calls. */
enum { BG_NONE, BG_THREAD, BG_CALLS };
static int background;
static int polling;    /* look at tcmalloc's numbers even without seeing frees */
static uint64_t polled_held; /* free bytes at the last tick, while polling */
static bool (*waker)(bool start);
static void (*soon)(void);

/* Returns released below this are not worth a system call. */
#define STEP ((uint64_t)2 << 20)

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static uint64_t delay_ms(void) { return fa_opt_u64(FA_OPT_RELEASE_DELAY); }
static uint64_t keep_bytes(void) { return fa_opt_u64(FA_OPT_RELEASE_THRESHOLD); }

static void decay_lock_take(void)
{
    while (__atomic_exchange_n(&decay_lock, 1, __ATOMIC_ACQUIRE))
        ;
}
static bool decay_lock_try(void) { return !__atomic_exchange_n(&decay_lock, 1, __ATOMIC_ACQUIRE); }
static void decay_lock_drop(void) { __atomic_store_n(&decay_lock, 0, __ATOMIC_RELEASE); }

/* Pre: decay_lock held.  A large allocation happened at now. */
static void allocated_at(uint64_t now)
{
    __atomic_store_n(&hot.prev_alloc_ms, hot.last_alloc_ms, __ATOMIC_RELAXED);
    __atomic_store_n(&hot.last_alloc_ms, now, __ATOMIC_RELAXED);
}

/* Pre: decay_lock held.  The windows changed other than by the
 * allocations' samples: the next sample is recorded whatever its value. */
static void windows_changed(void) { __atomic_store_n(&hot.sampled_ms, 0, __ATOMIC_RELAXED); }

/* Pre: decay_lock held. */
static void decay_start(uint64_t now)
{
    if (!decay_ready) {
        uint64_t delay = delay_ms() ? delay_ms() : 1;
        fa_decay_init(&decay, delay * idle_l.factor, now);
        fa_decay_init(&active, delay * busy_l.factor, now);
        decay_ready = 1;
    }
}

/* Ask tcmalloc to release `want` bytes (SIZE_MAX: everything free);
 * returns the bytes it unmapped, counted under `why`. */
static size_t release_and_count(size_t want, enum fa_release_reason why)
{
    size_t got = 0;
    /* tcmalloc releases whole spans and remembers any excess as credit
     * against later requests (extra_bytes_released_), so one call may
     * release nothing; a few rounds settle it. */
    for (int round = 0; round < 4 && got < want; round++) {
        size_t before = fa_tc_prop("tcmalloc.pageheap_unmapped_bytes");
        if (want == SIZE_MAX)
            MallocExtension_ReleaseFreeMemory();
        else
            MallocExtension_ReleaseToSystem(want - got);
        size_t after = fa_tc_prop("tcmalloc.pageheap_unmapped_bytes");
        got += after > before ? after - before : 0;
        if (want == SIZE_MAX)
            break;
    }
    if (got) {
        __atomic_store_n(&hot.read_ms, 0, __ATOMIC_RELAXED); /* the next sample reads tcmalloc again */
        __atomic_fetch_add(&releases, 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&by_reason[why], got, __ATOMIC_RELAXED);
        decay_lock_take();
        fa_decay_released(&decay, got);
        fa_decay_released(&active, got);
        windows_changed();
        decay_lock_drop();
    }
    return got;
}

/* Bytes tcmalloc holds free, and free or returned (`unused`), read from
 * tcmalloc now. */
static uint64_t read_tc_unused(uint64_t free_bytes)
{
    return free_bytes + fa_tc_prop("tcmalloc.pageheap_unmapped_bytes");
}

static uint64_t read_held(uint64_t now, uint64_t *unused)
{
    __atomic_store_n(&hot.moved, 0, __ATOMIC_RELAXED); /* before the read: what comes after counts against it */
    uint64_t v = fa_tc_prop("tcmalloc.pageheap_free_bytes");
    *unused = read_tc_unused(v);
    __atomic_store_n(&hot.read_free, v, __ATOMIC_RELAXED);
    __atomic_store_n(&hot.read_unused, *unused, __ATOMIC_RELAXED);
    __atomic_store_n(&hot.read_ms, now, __ATOMIC_RELAXED);
    return v;
}

static uint64_t moved_by(uint64_t read, int64_t since)
{
    int64_t est = (int64_t)read + since;
    return est > 0 ? (uint64_t)est : 0;
}

/* Sample the free bytes after a large allocation took some: the dips are
 * what the window remembers as demand. */
static void sample(void)
{
    uint64_t now = mono_ms();
    int64_t since = __atomic_load_n(&hot.moved, __ATOMIC_RELAXED) + unpublished;
    uint64_t free_bytes, unused;
    if (now != __atomic_load_n(&hot.read_ms, __ATOMIC_RELAXED)) {
        free_bytes = read_held(now, &unused);
    } else {
        free_bytes = moved_by(__atomic_load_n(&hot.read_free, __ATOMIC_RELAXED), since);
        unused = moved_by(__atomic_load_n(&hot.read_unused, __ATOMIC_RELAXED), since);
    }
    /* Nothing to record: a sample of this tick no higher was, and both
     * latest allocations are of this tick. */
    if (now == __atomic_load_n(&hot.sampled_ms, __ATOMIC_RELAXED) &&
        free_bytes >= __atomic_load_n(&hot.sampled_min, __ATOMIC_RELAXED) &&
        unused >= __atomic_load_n(&hot.sampled_min_unused, __ATOMIC_RELAXED) &&
        now == __atomic_load_n(&hot.prev_alloc_ms, __ATOMIC_RELAXED))
        return;
    if (!decay_lock_try())
        return;
    decay_start(now);
    fa_decay_observe(&decay, now, free_bytes, unused);
    fa_decay_observe(&active, now, free_bytes, unused);
    if (hot.sampled_ms != now || free_bytes < hot.sampled_min)
        __atomic_store_n(&hot.sampled_min, free_bytes, __ATOMIC_RELAXED);
    if (hot.sampled_ms != now || unused < hot.sampled_min_unused)
        __atomic_store_n(&hot.sampled_min_unused, unused, __ATOMIC_RELAXED);
    __atomic_store_n(&hot.sampled_ms, now, __ATOMIC_RELAXED);
    allocated_at(now);
    if (idle_l.released && !spell_end_ms)
        spell_end_ms = now; /* the idle spell a release cut into ends */
    decay_lock_drop();
}

/* FORGEALLOC_RELEASE_DELAY=0: return free memory at once when the heap
 * shrinks past the threshold, down to half of it (hysteresis). */
static void release_now(uint64_t threshold)
{
    __atomic_store_n(&hot.shrink, 0, __ATOMIC_RELAXED);
    size_t free_bytes = fa_tc_prop("tcmalloc.pageheap_free_bytes");
    if (free_bytes > threshold / 2)
        release_and_count(free_bytes - threshold / 2, FA_REL_threshold); /* retries tcmalloc's credit itself */
}

/* An idle release is regretted once this much of it is committed again,
 * even when that is less than half of it: a release that took a working
 * set back together with memory nobody needs any more (what loading a
 * model left free) cost a page fault for every byte of the working set
 * all the same. */
#define IDLE_REGRET ((uint64_t)128 << 20)

/* Judge a learner's last release: `again` bytes were committed again
 * since the last tick (counted when `counts`); a regret once half of the
 * release, or `enough`, is committed again.  Undecided until `until_ms`
 * unless regretted.  Returns the new factor (its current one when
 * unchanged). */
static unsigned judge(learner *l, uint64_t again, bool counts, uint64_t enough, uint64_t now)
{
    if (!l->released)
        return l->factor;
    if (counts)
        l->recommitted += again;
    bool regret = l->recommitted >= l->released / 2 || l->recommitted >= enough;
    if (!regret && now < l->until_ms)
        return l->factor;
    l->released = l->recommitted = 0;
    if (!regret)
        return l->factor > l->min ? l->factor / 2 : l->min;
    return l->factor < l->max ? l->factor * 2 : l->max;
}

static uint64_t covering(uint64_t spell_ms, uint64_t delay, unsigned max)
{
    unsigned f = 1;
    while (f < max && delay * f < spell_ms + spell_ms / 4)
        f *= 2;
    return f;
}

/* Bytes committed again since the last tick: tcmalloc's commit counter
 * less its reserve counter (growing the heap adds to both). */
static uint64_t committed_again(void)
{
    uint64_t commit = fa_tc_prop("tcmalloc.pageheap_total_commit_bytes");
    uint64_t reserve = fa_tc_prop("tcmalloc.pageheap_total_reserve_bytes");
    uint64_t grew = reserve > last_reserve ? reserve - last_reserve : 0;
    uint64_t again = commit > last_commit + grew ? commit - last_commit - grew : 0;
    last_commit = commit;
    last_reserve = reserve;
    return again;
}

/* Pre: decay_lock held.  Bytes tcmalloc committed again since the last
 * tick count against the releases being judged. */
static void judge_tick(uint64_t now)
{
    uint64_t again = committed_again();
    uint64_t delay = delay_ms();
    unsigned f = judge(&busy_l, again, true, UINT64_MAX, now);
    if (f != busy_l.factor) {
        busy_l.factor = f;
        fa_decay_init(&active, delay * f, now);
    }
    /* An idle release counts what came back once the program came back
     * within the horizon; commits seen at a later look, after a spell
     * longer than the horizon, are the program's new demand. */
    bool pending = idle_l.released;
    bool within = spell_end_ms ? spell_end_ms < idle_l.until_ms : now < idle_l.until_ms;
    f = judge(&idle_l, again, within, IDLE_REGRET, now);
    if (pending && !idle_l.released && f > idle_l.factor) { /* a regret */
        uint64_t end = spell_end_ms ? spell_end_ms : now;
        uint64_t cover = covering(end > spell_begin_ms ? end - spell_begin_ms : 0, delay, IDLE_MAX);
        if (cover > f)
            f = (unsigned)cover;
    }
    if (f != idle_l.factor) {
        __atomic_store_n(&idle_l.factor, f, __ATOMIC_RELAXED);
        fa_decay_init(&decay, delay * f, now);
    }
}

/* Pre: decay_lock held. */
static void judge_release(bool busy_heap, uint64_t got, uint64_t now)
{
    learner *l = busy_heap ? &busy_l : &idle_l;
    l->released += got;
    l->until_ms = now + delay_ms() * (busy_heap ? l->factor : IDLE_MAX);
    if (!busy_heap) {
        spell_begin_ms = hot.last_alloc_ms;
        spell_end_ms = 0;
    }
}

/* Free bytes held after the last tick. */
static uint64_t tick_held;

/* Memory pressure: the free memory held is more than half of what the
 * memory cgroup (or the machine) can still give.  What goes back is what
 * the windows say the next steps will not need: everything above the
 * largest amount the program took from free memory at once within them
 * (`demand`: a training step's buffers stay, a model unloaded goes).  Held
 * memory within that stays, so a job whose transient buffers fit under
 * its limit does not return and fault them in again on every step.  When
 * the room left is less than a quarter of what is held (something else
 * is taking the last of it), everything goes.  Returns the bytes to give
 * back (0: none). */
static uint64_t pressure_return(uint64_t held, uint64_t room, uint64_t demand)
{
    if (held <= room / 2)
        return 0;
    if (room < held / 4)
        return held;
    return held > demand ? held - demand : 0;
}

static uint64_t tick(uint64_t now)
{
    if (__atomic_exchange_n(&busy, 1, __ATOMIC_ACQUIRE))
        return now + 10; /* a caller is deciding right now; look again soon */
    int saved = errno;
    uint64_t keep = keep_bytes(), delay = delay_ms();
    __atomic_store_n(&hot.shrink, 0, __ATOMIC_RELAXED);
    uint64_t unused;
    uint64_t held = read_held(now, &unused);
    bool busy_heap = false;
    decay_lock_take();
    decay_start(now);
    judge_tick(now);
    /* Without the calls (polling), a drop of the free bytes since the last
     * tick is the sign that large allocations go on. */
    if (__atomic_load_n(&polling, __ATOMIC_RELAXED) && held + STEP < polled_held) {
        allocated_at(now);
    }
    polled_held = held;
    fa_decay_observe(&decay, now, held, unused);
    fa_decay_observe(&active, now, held, unused);
    /* Busy: two large allocations within the delay (one alone, such as the
     * call that runs this tick when there is no thread, is not a churn). */
    busy_heap = hot.prev_alloc_ms && now < hot.prev_alloc_ms + delay;
    /* Busy, memory is unused only where neither window saw it in use: the
     * first allocations of a prompt after an idle spell make the heap busy,
     * and the short window alone would give back the working set the idle
     * window learnt to keep across the spell. */
    uint64_t idle = !delay ? held : fa_decay_idle(&decay);
    if (delay && busy_heap && fa_decay_idle(&active) < idle)
        idle = fa_decay_idle(&active);
    uint64_t demand = fa_decay_demand(&active), idle_demand = fa_decay_demand(&decay);
    if (idle_demand > demand)
        demand = idle_demand;
    /* Quiet: no large allocation for the idle window and one delay more
     * (a WebUI between prompts).  The threshold kept for the next
     * allocation's sake goes too: the process settles as low as glibc with
     * malloc_trim. */
    uint64_t last_alloc = hot.last_alloc_ms, quiet = delay * (idle_l.factor + 1);
    if (delay && now >= last_alloc + quiet)
        keep = 0;
    uint64_t next = fa_decay_next_ms(&decay);
    windows_changed();
    decay_lock_drop();

    bool limited = false;
    uint64_t room = UINT64_MAX;
    if (held > STEP && fa_opt_u64(FA_OPT_RELEASE_PRESSURE)) {
        room = fa_pressure_headroom(&limited);
        uint64_t want = pressure_return(held, room, demand);
        if (want >= STEP) {
            size_t got = release_and_count(want >= held ? SIZE_MAX : want, FA_REL_pressure);
            held = held > got ? held - got : 0;
            idle = idle > got ? idle - got : 0;
            if (got && delay) {
                decay_lock_take();
                judge_release(busy_heap, got, now);
                decay_lock_drop();
            }
        }
    }
    if (idle > keep && idle - keep >= STEP) {
        size_t got = release_and_count(idle - keep, delay ? FA_REL_delay : FA_REL_threshold);
        held = held > got ? held - got : 0;
        if (got && delay) {
            decay_lock_take();
            judge_release(busy_heap, got, now);
            decay_lock_drop();
        }
    }
    /* A busy release is judged on time: the commits that count against it
     * are those seen before its horizon.  An idle one waits for the next
     * look (judge_tick). */
    uint64_t due = busy_l.released ? busy_l.until_ms : UINT64_MAX;
    __atomic_store_n(&tick_held, held, __ATOMIC_RELAXED);
    __atomic_store_n(&busy, 0, __ATOMIC_RELEASE);
    errno = saved;
    if (!__atomic_load_n(&polling, __ATOMIC_RELAXED) && held <= (keep > STEP ? keep : STEP)) {
        if (held <= STEP || !delay)
            next = due; /* nothing worth watching until large frees come back */
        else /* within the threshold: one more look once the heap is quiet */
            next = last_alloc + quiet + 1 < due ? last_alloc + quiet + 1 : due;
        if (next == UINT64_MAX)
            return 0;
    } else {
        /* Under a cgroup's limit, look every second, and often once what
         * is held comes within four times the room left: a job's memory can
         * grow by gigabytes between two slots of a long window. */
        uint64_t poll = held > room / 4 ? FA_RELEASE_PRESSURE_POLL_MS : 1000;
        if (limited && next > now + poll)
            next = now + poll;
        if (due < next)
            next = due;
    }
    return next > now ? next : now + 1;
}

/* When the policy runs next on its own (0: not until a wake). */
static uint64_t tick_due_ms;

uint64_t fa_release_tick(uint64_t now)
{
    uint64_t next = tick(now);
    __atomic_store_n(&tick_due_ms, next, __ATOMIC_RELAXED);
    return next;
}

/* No background thread: run the policy on this call when it is due. */
static void tick_inline(void)
{
    uint64_t now = mono_ms();
    if (now < __atomic_load_n(&inline_due_ms, __ATOMIC_RELAXED))
        return;
    uint64_t next = fa_release_tick(now);
    __atomic_store_n(&inline_due_ms, next ? next : now + 1, __ATOMIC_RELAXED);
}

/* Free memory worth watching is held (large frees past the threshold, or
 * what small frees left: fa_release_check_free): with
 * FORGEALLOC_RELEASE_DELAY=0 return it at once, down to half the
 * threshold; else the background watches it from now on, or,
 * where no thread can run, the calls themselves.  Where this call may not
 * start a thread, it runs the policy itself and the thread starts at the
 * next allocation. */
static void held_beyond(uint64_t threshold, bool may_start)
{
    int saved = errno; /* free() must keep errno; madvise may set it */
    if (delay_ms() == 0) {
        if (!__atomic_exchange_n(&busy, 1, __ATOMIC_ACQUIRE)) {
            release_now(threshold);
            __atomic_store_n(&busy, 0, __ATOMIC_RELEASE);
        }
    } else {
        bool (*w)(bool) = __atomic_load_n(&waker, __ATOMIC_ACQUIRE);
        bool thread = w && w(may_start);
        if (__atomic_load_n(&background, __ATOMIC_RELAXED) != BG_THREAD && (thread || may_start))
            __atomic_store_n(&background, thread ? BG_THREAD : BG_CALLS, __ATOMIC_RELAXED);
        if (!thread) {
            if (!may_start && w)
                fa_release_start_soon();
            tick_inline();
        }
    }
    errno = saved;
}

/* The balance at which a thread publishes (see unpublished). */
static int64_t batch(uint64_t threshold) { return threshold / 8 < (uint64_t)BATCH ? (int64_t)(threshold / 8) : BATCH; }

void fa_release_on_alloc(void *p, size_t n)
{
    remember(p, n);
    int64_t u = unpublished - (int64_t)n;
    if (u > -batch(keep_bytes())) {
        unpublished = u;
    } else {
        unpublished = 0;
        __atomic_add_fetch(&hot.moved, u, __ATOMIC_RELAXED);
        uint64_t took = (uint64_t)-u, old = __atomic_load_n(&hot.shrink, __ATOMIC_RELAXED), next;
        do {
            next = old > took ? old - took : 0;
        } while (old != next && !__atomic_compare_exchange_n(&hot.shrink, &old, next, true, __ATOMIC_RELAXED,
                                                              __ATOMIC_RELAXED));
    }
    if (delay_ms()) {
        int saved = errno;
        sample();
        if (__atomic_load_n(&background, __ATOMIC_RELAXED) == BG_CALLS)
            tick_inline();
        errno = saved;
    }
}

void fa_release_on_free(size_t n, bool may_start)
{
    uint64_t threshold = keep_bytes();
    int64_t u = unpublished + (int64_t)n;
    if (u < batch(threshold)) {
        unpublished = u;
        return;
    }
    unpublished = 0;
    __atomic_add_fetch(&hot.moved, u, __ATOMIC_RELAXED);
    if (__atomic_add_fetch(&hot.shrink, (uint64_t)u, __ATOMIC_RELAXED) <= threshold)
        return;
    held_beyond(threshold, may_start);
}

/* Small frees too: tcmalloc gives a span of small objects back to its
 * page heap once every object in it is free, and a program that frees a
 * large working set of small blocks (containers, strings, blocks of up to
 * 256 KiB) makes no large free to tell the policy.  Each thread's every
 * FA_RELEASE_CHECK_FREES-th free calls this; at most one call per tick of
 * the coarse clock among all threads reads what tcmalloc holds free.
 *
 * The reading is a sample of the windows, as a large allocation's is: a
 * program whose working set is made of small blocks takes and gives back
 * page-heap memory with no large call at all, and its demand must count
 * the same way.  A fall of more than STEP since the last such reading is
 * its allocations taking memory: the heap is in use, as after a large
 * allocation.
 *
 * With no look of the policy coming, more than STEP free starts one, as a
 * large free past the threshold does (with FORGEALLOC_RELEASE_DELAY=0:
 * more than the threshold); the background then watches it until it went
 * back or is reused.  With one coming, only a rise past the threshold
 * since the last look brings it forward. */
static uint64_t checked_ms;
static uint64_t checked_held; /* the free bytes at the last such reading */

/* A reading of the small-free path, into the windows. */
static void small_sample(uint64_t now, uint64_t held)
{
    if (!decay_lock_try())
        return; /* a tick is looking: its own reading covers this one */
    decay_start(now);
    uint64_t unused = read_tc_unused(held);
    fa_decay_observe(&decay, now, held, unused);
    fa_decay_observe(&active, now, held, unused);
    if (held + STEP < checked_held) {
        allocated_at(now);
        if (idle_l.released && !spell_end_ms)
            spell_end_ms = now;
    }
    checked_held = held;
    windows_changed();
    decay_lock_drop();
}

void fa_release_check_free(bool may_start)
{
    uint64_t now = mono_ms(), last = __atomic_load_n(&checked_ms, __ATOMIC_RELAXED);
    if (now == last || !__atomic_compare_exchange_n(&checked_ms, &last, now, false, __ATOMIC_RELAXED,
                                                    __ATOMIC_RELAXED))
        return;
    int saved = errno;
    uint64_t threshold = keep_bytes(), held = fa_tc_prop("tcmalloc.pageheap_free_bytes");
    if (delay_ms())
        small_sample(now, held);
    /* A look that is late by a second or more is not coming: the thread left. */
    uint64_t due = __atomic_load_n(&tick_due_ms, __ATOMIC_RELAXED);
    bool coming = due && now < due + 1000;
    uint64_t mark = !delay_ms() ? threshold
                    : coming    ? __atomic_load_n(&tick_held, __ATOMIC_RELAXED) + (threshold > STEP ? threshold : STEP)
                                : STEP;
    if (held > mark)
        held_beyond(threshold, may_start);
    errno = saved;
}

void fa_release_set_waker(bool (*wake)(bool start)) { __atomic_store_n(&waker, wake, __ATOMIC_RELEASE); }
void fa_release_set_soon(void (*f)(void)) { __atomic_store_n(&soon, f, __ATOMIC_RELEASE); }

/* A forked child with periodic dumps starts its thread at a later call,
 * not in the fork handler. */
static int nudge_due;
static void nudge_later(void) { __atomic_store_n(&nudge_due, 1, __ATOMIC_RELAXED); }
void fa_release_nudge(void)
{
    if (!__atomic_load_n(&nudge_due, __ATOMIC_RELAXED) || !__atomic_exchange_n(&nudge_due, 0, __ATOMIC_ACQUIRE))
        return;
    bool (*w)(bool) = __atomic_load_n(&waker, __ATOMIC_ACQUIRE);
    if (w && !w(true))
        nudge_later(); /* not yet (just after a fork): the next check asks again */
}

/* The thread starts at the next allocating call (through the host's
 * `soon` hook), or else at the next nudge. */
void fa_release_start_soon(void)
{
    nudge_later();
    void (*f)(void) = __atomic_load_n(&soon, __ATOMIC_ACQUIRE);
    if (f)
        f();
}

void fa_release_set_polling(bool on) { __atomic_store_n(&polling, on, __ATOMIC_RELAXED); }
bool fa_release_polling(void) { return __atomic_load_n(&polling, __ATOMIC_RELAXED); }

/* 0 unknown, 1 madvise mode (advise), 2 always/never/absent (do nothing). */
static int thp_mode;

static int read_thp_mode(void)
{
    char buf[128];
    fa_read_file("/sys/kernel/mm/transparent_hugepage/enabled", buf, sizeof buf);
    return strstr(buf, "[madvise]") ? 1 : 2;
}

bool fa_release_thp_advised(void)
{
    int mode = __atomic_load_n(&thp_mode, __ATOMIC_RELAXED);
    if (mode == 0) {
        mode = read_thp_mode();
        __atomic_store_n(&thp_mode, mode, __ATOMIC_RELAXED);
    }
    return mode == 1;
}

void fa_release_advise_huge(void *p, size_t n)
{
    if (!fa_release_thp_advised())
        return;
    const uintptr_t huge = (uintptr_t)2 << 20;
    uintptr_t a = ((uintptr_t)p + huge - 1) & ~(huge - 1);
    uintptr_t e = ((uintptr_t)p + n) & ~(huge - 1);
    if (e > a) {
        int saved = errno;
        madvise((void *)a, e - a, MADV_HUGEPAGE);
        errno = saved;
    }
}

/* Everything free back at once, counted under `why`.  One release at a
 * time: each counts what tcmalloc unmapped while it ran, so two at once
 * would both count the same bytes.  wait: wait for a tick under way (at
 * most one pass of its own release); else leave the heap to it. */
static size_t release_everything(enum fa_release_reason why, bool wait)
{
    int saved = errno;
    while (__atomic_exchange_n(&busy, 1, __ATOMIC_ACQUIRE)) {
        if (!wait) {
            errno = saved;
            return 0;
        }
        sched_yield();
    }
    size_t got = release_and_count(SIZE_MAX, why);
    __atomic_store_n(&hot.shrink, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&busy, 0, __ATOMIC_RELEASE);
    errno = saved;
    return got;
}

size_t fa_release_all(void)
{
    fa_owner_adopt(); /* a child of a fork without handlers: a tick of the parent's thread may have held `busy` */
    return release_everything(FA_REL_request, true);
}

void fa_release_before_fork(void)
{
    /* What the windows call unused goes back now, as the thread's next
     * look would have returned it; what the program used within them stays
     * (a program that forks per task needs it again after the fork).  The
     * thread left: no look is coming, so the next check of the free path
     * (or the next large frees) starts it again. */
    tick(mono_ms());
    __atomic_store_n(&tick_due_ms, 0, __ATOMIC_RELAXED);
    nudge_later();
}

void fa_release_totals(uint64_t *count, uint64_t bytes[FA_REL_COUNT])
{
    *count = __atomic_load_n(&releases, __ATOMIC_RELAXED);
    for (int i = 0; i < FA_REL_COUNT; i++)
        bytes[i] = __atomic_load_n(&by_reason[i], __ATOMIC_RELAXED);
}

uint64_t fa_release_hold_ms(void) { return delay_ms() * __atomic_load_n(&idle_l.factor, __ATOMIC_RELAXED); }

bool fa_release_in_background(void)
{
    return __atomic_load_n(&background, __ATOMIC_RELAXED) == BG_THREAD || __atomic_load_n(&polling, __ATOMIC_RELAXED);
}

/* The child's own policy: no thread, nothing learnt, nothing returned
 * yet.  The tables stay: the child inherits the parent's live blocks. */
static void reset_child(void)
{
    memset(&hot, 0, sizeof hot);
    nudge_due = 0; /* the parent's, for its own thread (fa_release_before_fork) */
    unpublished = 0; /* the thread that forked: the child's only one */
    busy = 0;
    releases = 0;
    memset(by_reason, 0, sizeof by_reason);
    decay_lock = 0;
    decay_ready = 0;
    polled_held = 0;
    /* The child learns its own holds (a worker rarely reuses its parent's
     * working set). */
    busy_l.factor = busy_l.min;
    idle_l.factor = idle_l.min;
    busy_l.released = idle_l.released = 0;
    last_commit = last_reserve = spell_begin_ms = spell_end_ms = 0;
    inline_due_ms = 0;
    tick_due_ms = checked_ms = checked_held = tick_held = 0;
    background = BG_NONE;
    fa_pressure_reset();
}

void fa_release_fork_child(void)
{
    /* The child has no background thread: it starts its own when it needs
     * one, at its first allocation when it inherits free memory beyond the
     * threshold (which its parent's returns would leave to it alone).
     * tcmalloc's fork handler, registered before ours, has run: its
     * numbers can be read. */
    bool inherited = background != BG_NONE && delay_ms() &&
                     fa_tc_prop("tcmalloc.pageheap_free_bytes") > (keep_bytes() > STEP ? keep_bytes() : STEP);
    reset_child();
    if (inherited)
        fa_release_start_soon();
}

void fa_release_adopt(void)
{
    /* tcmalloc's numbers cannot be read here (a lock of its may be held by
     * a thread of the parent): a parent that held large free memory may
     * have left it to the child, whose thread looks at its next
     * allocation. */
    bool inherited = background != BG_NONE && delay_ms();
    reset_child();
    if (inherited)
        fa_release_start_soon();
}
