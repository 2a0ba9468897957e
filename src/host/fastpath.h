/* fastpath.h - the fast paths of malloc, free, operator new and delete,
 * expanded inline into the override files' exported functions: reach the
 * thread's record (one initial-exec TLS load), pass one gate, make one
 * add, jump into tcmalloc.  Everything else (other sizes, the thread's
 * first call, large blocks, the release policy's look) is a jump out of
 * line, to host.c (and, for the C++ forms, override_cxx.cc). */
#ifndef FA_FASTPATH_H
#define FA_FASTPATH_H

#include <stddef.h>
#include <stdint.h>

#include "../stats/stats.h"
#include "host.h"

#ifdef __cplusplus
extern "C" {
#endif

/* nothrow: a delete (noexcept) can then jump to them. */
void *tc_malloc(size_t size) __attribute__((nothrow));
void *tc_calloc(size_t n, size_t size) __attribute__((nothrow));
void tc_free(void *p) __attribute__((nothrow));
void *tc_new(size_t size);
void tc_delete(void *p) __attribute__((nothrow));
void tc_delete_sized(void *p, size_t size) __attribute__((nothrow));

#ifdef __cplusplus
}
#endif

/* The smallest size of the fast paths: below it tcmalloc's class would
 * align to 8 bytes only, where glibc aligns every block to 16 (host.c). */
#define FA_FAST_MIN FA_SMALL_MIN

/* The caller's return address, read where it is used: in the out-of-line
 * branch only (the asm keeps the compiler from loading it ahead of the
 * branch, on the fast path).  These functions are inlined into the
 * exported ones, so it is the program's return address. */
#define FA_SLOW_CALLER                              \
    ({                                              \
        void *fa_c_ = __builtin_return_address(0);  \
        __asm__("" : "+r"(fa_c_));                  \
        fa_c_;                                      \
    })

#define FA_FAST static inline __attribute__((always_inline))
#define FA_LIKELY(x) __builtin_expect(!!(x), 1)
#define FA_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* Jump to `out` when p & *mask is 0 (`test` with the record's mask in
 * memory), and when the countdown wraps (a 16-bit `sub` and its borrow):
 * one instruction and a branch each, where the compiler's own code takes
 * two and four. */
#if defined(__x86_64__)
#define FA_GATE_CLOSED(p, mask, out) \
    __asm__ goto("test %1, %0\n\tjz %l[" #out "]" : : "m"(mask), "r"(p) : "cc" : out)
#define FA_COUNTDOWN(cd, out) __asm__ goto("subw $1, %0\n\tjc %l[" #out "]" : "+m"((cd).left) : : "cc" : out)
#else
#define FA_GATE_CLOSED(p, mask, out)                  \
    do {                                              \
        if (FA_UNLIKELY(((uintptr_t)(p) & (mask)) == 0)) \
            goto out;                                 \
    } while (0)
#define FA_COUNTDOWN(cd, out)                         \
    do {                                              \
        if (FA_UNLIKELY(fa_countdown_tick(&(cd))))    \
            goto out;                                 \
    } while (0)
#endif

/* The gate: n - 16 < limit, 16 B up to 4 KiB; the size's power of two
 * gives its slot (fa_small_slot). */
FA_FAST void *fa_fast_malloc(size_t n)
{
    fa_tstats *t = fa_tls_stats;
    size_t k = n - FA_FAST_MIN;
    if (FA_UNLIKELY(k >= t->malloc_limit))
        return fa_host_malloc_other(n, FA_SLOW_CALLER);
    FA_RELAXED_ADD(t->small[FA_SMALL_malloc][FA_SMALL_POW + fa_small_log2(n)], 1);
    FA_RELAXED_ADD(t->small_bytes, n);
    return tc_malloc(n);
}

/* The same gate for the product; tcmalloc's calloc multiplies again. */
FA_FAST void *fa_fast_calloc(size_t n, size_t size)
{
    fa_tstats *t = fa_tls_stats;
    size_t total;
    if (FA_UNLIKELY(__builtin_mul_overflow(n, size, &total)))
        return fa_host_calloc(n, size, FA_SLOW_CALLER);
    size_t k = total - FA_FAST_MIN;
    if (FA_UNLIKELY(k >= t->malloc_limit))
        return fa_host_calloc(n, size, FA_SLOW_CALLER);
    FA_RELAXED_ADD(t->small[FA_SMALL_calloc][FA_SMALL_POW + fa_small_log2(total)], 1);
    FA_RELAXED_ADD(t->small_bytes, total);
    return tc_calloc(n, size);
}

FA_FAST void fa_fast_free(void *p)
{
    fa_tstats *t = fa_tls_stats;
    FA_GATE_CLOSED(p, t->free_mask, other);
    FA_COUNTDOWN(t->frees, due);
    tc_free(p);
    return;
other:
    fa_host_free(p, FA_SLOW_CALLER);
    return;
due:
    fa_host_free_due(p, FA_SLOW_CALLER);
}

#ifdef __cplusplus
/* Which replaceable form a derived operator calls when the program (or an
 * allocator ahead of forgealloc) replaces some of them: none for the four
 * forms with no parent (override_cxx.cc). */
enum fa_cxx_parent { FA_PARENT_NONE, FA_PARENT_NEW, FA_PARENT_DELETE, FA_PARENT_DELETE_ARRAY };
void *fa_cxx_new_other(std::size_t n, fa_cxx_parent parent, void *caller);
void fa_cxx_delete_other(void *p, std::size_t n, fa_cxx_parent parent) noexcept;

FA_FAST void *fa_fast_new(std::size_t n, fa_cxx_parent parent)
{
    fa_tstats *t = fa_tls_stats;
    std::size_t k = n - FA_FAST_MIN;
    if (FA_UNLIKELY(k >= t->new_limit))
        return fa_cxx_new_other(n, parent, FA_SLOW_CALLER);
    FA_RELAXED_ADD(t->small[FA_SMALL_new][FA_SMALL_POW + fa_small_log2(n)], 1);
    FA_RELAXED_ADD(t->small_bytes, n);
    return tc_new(n);
}

/* operator delete without a size. */
FA_FAST void fa_fast_delete(void *p, fa_cxx_parent parent)
{
    fa_tstats *t = fa_tls_stats;
    FA_GATE_CLOSED(p, t->delete_mask, other);
    FA_COUNTDOWN(t->deletes, due);
    return tc_delete(p);
other:
    return fa_cxx_delete_other(p, 0, parent);
due:
    return fa_host_delete_due(p, 0);
}

/* A sized delete names tcmalloc's size class, so it must name the one new
 * used: 16 bytes below 16 (0 included). */
FA_FAST void fa_fast_delete_sized(void *p, std::size_t n, fa_cxx_parent parent)
{
    fa_tstats *t = fa_tls_stats;
    FA_GATE_CLOSED(p, t->delete_mask, other);
    FA_COUNTDOWN(t->deletes, due);
    if (FA_UNLIKELY(n < FA_FAST_MIN))
        return tc_delete_sized(p, FA_FAST_MIN);
    return tc_delete_sized(p, n);
other:
    return fa_cxx_delete_other(p, n < FA_FAST_MIN ? FA_FAST_MIN : n, parent);
due:
    return fa_host_delete_due(p, n < FA_FAST_MIN ? FA_FAST_MIN : n);
}
#endif

#endif
