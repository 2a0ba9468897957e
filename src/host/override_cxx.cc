// override_cxx.cc - every C++ operator new/new[]/delete/delete[] variant
// (plain, sized, aligned, nothrow: 8 new + 12 delete), each a one-line
// forward to the host core (the most used through its inline fast path,
// fastpath.h).  The new-handler and std::bad_alloc are tcmalloc's tc_new
// family's job.
//
// A program may replace some of these itself (the standard allows
// replacing just operator new(size_t) and operator delete(void *)), and
// an allocator preloaded ahead of forgealloc may define only some.  The
// forms left to forgealloc must then reach the replacements as libstdc++'s
// do: each derived form calls its parent (new[] -> new, sized delete ->
// delete, nothrow new -> new inside a try, ...), found where the loader
// finds it.  fa_host_cxx_check decides that once, at start, and then shuts
// the fast paths of operator new and delete, so the forms that have one
// meet their parents on their way out of line.
#include <cstddef>
#include <dlfcn.h>
#include <new>

#include "../core/export.h"
#include "fastpath.h"
#include "host.h"

#define AL(a) static_cast<std::size_t>(a)

namespace {
// The parents of the derived forms, as the global lookup finds them.
struct parents {
    void *(*nw)(std::size_t);
    void *(*nwa)(std::size_t);
    void (*del)(void *);
    void (*dela)(void *);
    void *(*nw_al)(std::size_t, std::align_val_t);
    void *(*nwa_al)(std::size_t, std::align_val_t);
    void (*del_al)(void *, std::align_val_t);
    void (*dela_al)(void *, std::align_val_t);
};
parents parent;
bool replaced; // some parent is not ours: derived forms call their parents

template <typename F, typename... A> void *try_new(F f, A... a) noexcept
{
    try {
        return f(a...);
    } catch (...) {
        return nullptr;
    }
}
} // namespace

#define REPLACED __builtin_expect(__atomic_load_n(&replaced, __ATOMIC_RELAXED), 0)

extern "C" void fa_host_cxx_bad_alloc(void) { throw std::bad_alloc(); }

extern "C" void fa_host_cxx_check(void)
{
    static const char *const names[] = {"_Znwm",  "_Znam",  "_ZnwmSt11align_val_t",  "_ZnamSt11align_val_t",
                                        "_ZdlPv", "_ZdaPv", "_ZdlPvSt11align_val_t", "_ZdaPvSt11align_val_t"};
    // Ours unless the global lookup finds another object's.  (A program
    // built without PIE that takes one's address makes its PLT stub the
    // answer: then the forms forward through that stub, to ours.)
    Dl_info self, info;
    if (!dladdr(reinterpret_cast<void *>(fa_host_cxx_check), &self))
        return;
    void *f[8];
    bool ours = true;
    for (int i = 0; i < 8; i++) {
        f[i] = dlsym(RTLD_DEFAULT, names[i]);
        if (!f[i])
            return; // cannot forward: keep serving every form here
        ours = ours && dladdr(f[i], &info) && info.dli_fbase == self.dli_fbase;
    }
    if (ours)
        return;
    parent.nw = reinterpret_cast<void *(*)(std::size_t)>(f[0]);
    parent.nwa = reinterpret_cast<void *(*)(std::size_t)>(f[1]);
    parent.nw_al = reinterpret_cast<void *(*)(std::size_t, std::align_val_t)>(f[2]);
    parent.nwa_al = reinterpret_cast<void *(*)(std::size_t, std::align_val_t)>(f[3]);
    parent.del = reinterpret_cast<void (*)(void *)>(f[4]);
    parent.dela = reinterpret_cast<void (*)(void *)>(f[5]);
    parent.del_al = reinterpret_cast<void (*)(void *, std::align_val_t)>(f[6]);
    parent.dela_al = reinterpret_cast<void (*)(void *, std::align_val_t)>(f[7]);
    __atomic_store_n(&replaced, true, __ATOMIC_RELEASE);
    fa_host_cxx_gates(false);
}

// The out-of-line paths of the forms with a fast path (fastpath.h).
void *fa_cxx_new_other(std::size_t n, fa_cxx_parent form, void *caller)
{
    if (form == FA_PARENT_NEW && REPLACED)
        return parent.nw(n);
    return fa_host_new_other(n, caller);
}

void fa_cxx_delete_other(void *p, std::size_t n, fa_cxx_parent form) noexcept
{
    if (REPLACED && form != FA_PARENT_NONE)
        return form == FA_PARENT_DELETE_ARRAY ? parent.dela(p) : parent.del(p);
    fa_host_delete(p, n, 0);
}

// The four forms with no parent.
FA_EXPORT void *operator new(std::size_t n) { return fa_fast_new(n, FA_PARENT_NONE); }
FA_EXPORT void *operator new(std::size_t n, std::align_val_t a) { return fa_host_new(n, AL(a), FA_CALLER); }
FA_EXPORT void operator delete(void *p) noexcept { fa_fast_delete(p, FA_PARENT_NONE); }
FA_EXPORT void operator delete(void *p, std::align_val_t a) noexcept { fa_host_delete(p, 0, AL(a)); }

// The derived forms: the four most used have a fast path, and meet the
// program's replacements out of line (fa_cxx_new_other, fa_cxx_delete_other).
FA_EXPORT void *operator new[](std::size_t n) { return fa_fast_new(n, FA_PARENT_NEW); }
FA_EXPORT void *operator new(std::size_t n, const std::nothrow_t &) noexcept
{
    return REPLACED ? try_new(parent.nw, n) : try_new(fa_host_new, n, std::size_t(0), FA_CALLER);
}
FA_EXPORT void *operator new[](std::size_t n, const std::nothrow_t &) noexcept
{
    return REPLACED ? try_new(parent.nwa, n) : try_new(fa_host_new, n, std::size_t(0), FA_CALLER);
}
FA_EXPORT void *operator new[](std::size_t n, std::align_val_t a)
{
    return REPLACED ? parent.nw_al(n, a) : fa_host_new(n, AL(a), FA_CALLER);
}
FA_EXPORT void *operator new(std::size_t n, std::align_val_t a, const std::nothrow_t &) noexcept
{
    return REPLACED ? try_new(parent.nw_al, n, a) : try_new(fa_host_new, n, std::size_t(AL(a)), FA_CALLER);
}
FA_EXPORT void *operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t &) noexcept
{
    return REPLACED ? try_new(parent.nwa_al, n, a) : try_new(fa_host_new, n, std::size_t(AL(a)), FA_CALLER);
}

FA_EXPORT void operator delete[](void *p) noexcept { fa_fast_delete(p, FA_PARENT_DELETE); }
FA_EXPORT void operator delete(void *p, const std::nothrow_t &) noexcept { REPLACED ? parent.del(p) : fa_host_delete(p, 0, 0); }
FA_EXPORT void operator delete[](void *p, const std::nothrow_t &) noexcept { REPLACED ? parent.dela(p) : fa_host_delete(p, 0, 0); }
FA_EXPORT void operator delete(void *p, std::size_t n) noexcept { fa_fast_delete_sized(p, n, FA_PARENT_DELETE); }
FA_EXPORT void operator delete[](void *p, std::size_t n) noexcept { fa_fast_delete_sized(p, n, FA_PARENT_DELETE_ARRAY); }
FA_EXPORT void operator delete[](void *p, std::align_val_t a) noexcept { REPLACED ? parent.del_al(p, a) : fa_host_delete(p, 0, AL(a)); }
FA_EXPORT void operator delete(void *p, std::align_val_t a, const std::nothrow_t &) noexcept { REPLACED ? parent.del_al(p, a) : fa_host_delete(p, 0, AL(a)); }
FA_EXPORT void operator delete[](void *p, std::align_val_t a, const std::nothrow_t &) noexcept { REPLACED ? parent.dela_al(p, a) : fa_host_delete(p, 0, AL(a)); }
FA_EXPORT void operator delete(void *p, std::size_t n, std::align_val_t a) noexcept { REPLACED ? parent.del_al(p, a) : fa_host_delete(p, n, AL(a)); }
FA_EXPORT void operator delete[](void *p, std::size_t n, std::align_val_t a) noexcept { REPLACED ? parent.dela_al(p, a) : fa_host_delete(p, n, AL(a)); }
