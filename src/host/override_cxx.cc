// override_cxx.cc - every C++ operator new/new[]/delete/delete[] variant
// (plain, sized, aligned, nothrow: 8 new + 12 delete), each a one-line
// forward to the host core.  The new-handler and std::bad_alloc are
// tcmalloc's tc_new family's job (called from fa_host_new).
#include <cstddef>
#include <new>

#include "../core/export.h"
#include "host.h"

#define AL(a) static_cast<std::size_t>(a)

FA_EXPORT void *operator new(std::size_t n) { return fa_host_new(n, 0, false, FA_CALLER); }
FA_EXPORT void *operator new[](std::size_t n) { return fa_host_new(n, 0, false, FA_CALLER); }
FA_EXPORT void *operator new(std::size_t n, const std::nothrow_t &) noexcept { return fa_host_new(n, 0, true, FA_CALLER); }
FA_EXPORT void *operator new[](std::size_t n, const std::nothrow_t &) noexcept { return fa_host_new(n, 0, true, FA_CALLER); }
FA_EXPORT void *operator new(std::size_t n, std::align_val_t a) { return fa_host_new(n, AL(a), false, FA_CALLER); }
FA_EXPORT void *operator new[](std::size_t n, std::align_val_t a) { return fa_host_new(n, AL(a), false, FA_CALLER); }
FA_EXPORT void *operator new(std::size_t n, std::align_val_t a, const std::nothrow_t &) noexcept { return fa_host_new(n, AL(a), true, FA_CALLER); }
FA_EXPORT void *operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t &) noexcept { return fa_host_new(n, AL(a), true, FA_CALLER); }

FA_EXPORT void operator delete(void *p) noexcept { fa_host_delete(p, 0, 0); }
FA_EXPORT void operator delete[](void *p) noexcept { fa_host_delete(p, 0, 0); }
FA_EXPORT void operator delete(void *p, const std::nothrow_t &) noexcept { fa_host_delete(p, 0, 0); }
FA_EXPORT void operator delete[](void *p, const std::nothrow_t &) noexcept { fa_host_delete(p, 0, 0); }
FA_EXPORT void operator delete(void *p, std::size_t n) noexcept { fa_host_delete(p, n, 0); }
FA_EXPORT void operator delete[](void *p, std::size_t n) noexcept { fa_host_delete(p, n, 0); }
FA_EXPORT void operator delete(void *p, std::align_val_t a) noexcept { fa_host_delete(p, 0, AL(a)); }
FA_EXPORT void operator delete[](void *p, std::align_val_t a) noexcept { fa_host_delete(p, 0, AL(a)); }
FA_EXPORT void operator delete(void *p, std::align_val_t a, const std::nothrow_t &) noexcept { fa_host_delete(p, 0, AL(a)); }
FA_EXPORT void operator delete[](void *p, std::align_val_t a, const std::nothrow_t &) noexcept { fa_host_delete(p, 0, AL(a)); }
FA_EXPORT void operator delete(void *p, std::size_t n, std::align_val_t a) noexcept { fa_host_delete(p, n, AL(a)); }
FA_EXPORT void operator delete[](void *p, std::size_t n, std::align_val_t a) noexcept { fa_host_delete(p, n, AL(a)); }
