// p_opnew.cc - every form of operator new/delete, in a program that (built
// with REPLACE) replaces only the four basic ones with a pool of its own,
// as the standard allows: every other form must reach them, as libstdc++'s
// do.  Built without REPLACE, it runs the same forms against whatever
// serves them (an allocator preloaded ahead of forgealloc).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <sys/mman.h>
#include <vector>

#ifdef REPLACE
static const std::size_t POOL = std::size_t(1) << 26;
static char *pool, *top;

static void *take(std::size_t n, std::size_t align)
{
    if (!pool) {
        void *m = mmap(nullptr, POOL, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED)
            std::abort();
        top = pool = static_cast<char *>(m);
    }
    std::uintptr_t t = (reinterpret_cast<std::uintptr_t>(top) + align - 1) & ~(std::uintptr_t)(align - 1);
    top = reinterpret_cast<char *>(t) + n;
    if (top > pool + POOL)
        throw std::bad_alloc();
    return reinterpret_cast<void *>(t);
}

static void give(void *p)
{
    if (p && (static_cast<char *>(p) < pool || static_cast<char *>(p) >= pool + POOL)) {
        std::fprintf(stderr, "p_opnew: %p did not come from the program's operator new\n", p);
        std::abort();
    }
}

void *operator new(std::size_t n) { return take(n ? n : 1, 16); }
void operator delete(void *p) noexcept { give(p); }
void *operator new(std::size_t n, std::align_val_t a) { return take(n ? n : 1, static_cast<std::size_t>(a)); }
void operator delete(void *p, std::align_val_t) noexcept { give(p); }
#endif

struct alignas(64) Wide {
    char c[100];
};
struct Plain {
    int x[10];
};

int main()
{
    const std::align_val_t al{64};
    // The derived forms, called directly.
    operator delete[](operator new[](40));
    operator delete(operator new(40, std::nothrow), std::nothrow);
    operator delete[](operator new[](40, std::nothrow), std::nothrow);
    operator delete(operator new(40), std::size_t(40));
    operator delete[](operator new[](40), std::size_t(40));
    operator delete[](operator new[](40, al), al);
    operator delete(operator new(40, al, std::nothrow), al, std::nothrow);
    operator delete[](operator new[](40, al, std::nothrow), al, std::nothrow);
    operator delete(operator new(40, al), std::size_t(40), al);
    operator delete[](operator new[](40, al), std::size_t(40), al);
    // As the compiler emits them.
    Plain *p = new Plain;
    delete p; // sized delete
    Plain *a = new Plain[4];
    delete[] a;
    Plain *n = new (std::nothrow) Plain;
    delete n;
    Wide *w = new Wide; // aligned new, sized aligned delete
    delete w;
    Wide *wa = new Wide[3];
    delete[] wa;
    std::vector<std::string> v(100, std::string(50, 'x'));
    std::puts("ok");
    return 0;
}
