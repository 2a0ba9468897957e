// p_cxx.cc - every operator new/delete variant under the shim: counted
// exactly (8 new, 12 delete), aligned correctly, new-handler honoured,
// std::bad_alloc thrown, nothrow returning nullptr; plus ordinary
// container and exception traffic.
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

using stat_fn = int (*)(const char *, uint64_t *);
static stat_fn stat_of;
static int failures;

#define CHECK(cond)                                                   \
    do {                                                              \
        if (!(cond)) {                                                \
            std::fprintf(stderr, "p_cxx: %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                               \
        }                                                             \
    } while (0)

static uint64_t count(const char *key)
{
    uint64_t v = 0;
    if (stat_of(key, &v) != 0)
        std::fprintf(stderr, "p_cxx: no stat %s\n", key), std::exit(1);
    return v;
}

static bool aligned(const void *p, std::size_t a) { return (reinterpret_cast<std::uintptr_t>(p) & (a - 1)) == 0; }

static int handler_calls;
static void *reserve;
static void release_reserve_then_give_up()
{
    handler_calls++;
    if (reserve) {
        std::free(reserve);
        reserve = nullptr;
    } else {
        std::set_new_handler(nullptr); // next failure throws
    }
}

int main()
{
    stat_of = reinterpret_cast<stat_fn>(dlsym(RTLD_DEFAULT, "forgealloc_stat"));
    if (!stat_of) {
        std::fprintf(stderr, "p_cxx: libforgealloc.so is not preloaded\n");
        return 1;
    }
    const std::align_val_t al{4096};
    uint64_t new0 = count("host.calls.new"), del0 = count("host.calls.delete");

    void *a = operator new(24);
    void *b = operator new[](24);
    void *c = operator new(24, std::nothrow);
    void *d = operator new[](24, std::nothrow);
    void *e = operator new(24, al);
    void *f = operator new[](24, al);
    void *g = operator new(24, al, std::nothrow);
    void *h = operator new[](24, al, std::nothrow);
    CHECK(aligned(e, 4096) && aligned(f, 4096) && aligned(g, 4096) && aligned(h, 4096));
    void *extra[4] = {operator new(24), operator new[](24), operator new(24, al), operator new[](24, al)};
    CHECK(count("host.calls.new") - new0 == 12);

    operator delete(a);
    operator delete[](b);
    operator delete(c, std::nothrow);
    operator delete[](d, std::nothrow);
    operator delete(e, al);
    operator delete[](f, al);
    operator delete(g, al, std::nothrow);
    operator delete[](h, al, std::nothrow);
    operator delete(extra[0], 24);
    operator delete[](extra[1], 24);
    operator delete(extra[2], 24, al);
    operator delete[](extra[3], 24, al);
    CHECK(count("host.calls.delete") - del0 == 12);
    CHECK(count("host.calls.new") - new0 == 12);

    // Large alignments.
    for (std::size_t align : {16ul, 64ul, 256ul, 8192ul, 1ul << 20}) {
        void *p = operator new(100, std::align_val_t{align});
        CHECK(aligned(p, align));
        operator delete(p, std::align_val_t{align});
    }

    // An alignment that is not a power of two: no block and no
    // new-handler call, as from libstdc++ (std::bad_alloc, or nullptr).
    CHECK(operator new(100, std::align_val_t{24}, std::nothrow) == nullptr);
    CHECK(operator new[](100, std::align_val_t{3}, std::nothrow) == nullptr);
    bool odd_threw = false;
    try {
        void *p = operator new(100, std::align_val_t{48});
        operator delete(p, std::align_val_t{48});
    } catch (const std::bad_alloc &) {
        odd_threw = true;
    }
    CHECK(odd_threw);

    // New-handler: called until it gives up, then std::bad_alloc.
    reserve = std::malloc(1 << 20);
    std::set_new_handler(release_reserve_then_give_up);
    bool threw = false;
    try {
        void *huge = operator new(SIZE_MAX / 2);
        operator delete(huge);
    } catch (const std::bad_alloc &) {
        threw = true;
    }
    CHECK(threw);
    CHECK(handler_calls == 2);
    CHECK(reserve == nullptr);
    CHECK(std::get_new_handler() == nullptr);
    CHECK(operator new(SIZE_MAX / 2, std::nothrow) == nullptr);
    CHECK(operator new[](SIZE_MAX / 2, al, std::nothrow) == nullptr);
    threw = false;
    try {
        (void)operator new[](SIZE_MAX / 2, al);
    } catch (const std::bad_alloc &) {
        threw = true;
    }
    CHECK(threw);

    // A new-handler that throws something other than std::bad_alloc: the
    // nothrow forms return nullptr, as libstdc++'s (which call the throwing
    // form inside a catch-all); the throwing forms pass it on.
    struct not_bad_alloc {};
    std::set_new_handler([] { throw not_bad_alloc(); });
    CHECK(operator new(SIZE_MAX / 2, std::nothrow) == nullptr);
    CHECK(operator new[](SIZE_MAX / 2, std::nothrow) == nullptr);
    CHECK(operator new(SIZE_MAX / 2, al, std::nothrow) == nullptr);
    CHECK(operator new[](SIZE_MAX / 2, al, std::nothrow) == nullptr);
    bool passed_on = false;
    try {
        (void)operator new(SIZE_MAX / 2);
    } catch (const not_bad_alloc &) {
        passed_on = true;
    }
    CHECK(passed_on);
    std::set_new_handler(nullptr);

    // The smallest blocks are 16-byte aligned (glibc's malloc alignment),
    // and a sized delete gives them back to the class they came from: a
    // ring of live blocks of 0-24 bytes, each filled with its own byte,
    // stays intact while others come and go.
    struct live {
        unsigned char *p;
        std::size_t n;
        bool array;
    } ring[512] = {};
    int small_misaligned = 0, overwritten = 0;
    for (unsigned i = 0; i < 200000; i++) {
        live &l = ring[(i * 2654435761u) % 512];
        if (l.p) {
            for (std::size_t k = 0; k < l.n; k++)
                overwritten += l.p[k] != static_cast<unsigned char>(l.n);
            l.array ? operator delete[](l.p, l.n) : operator delete(l.p, l.n);
        }
        l.n = i % 25;
        l.array = i & 1;
        l.p = static_cast<unsigned char *>(l.array ? operator new[](l.n) : operator new(l.n));
        small_misaligned += !aligned(l.p, 16);
        for (std::size_t k = 0; k < l.n; k++)
            l.p[k] = static_cast<unsigned char>(l.n);
    }
    for (live &l : ring)
        if (l.p)
            l.array ? operator delete[](l.p) : operator delete(l.p);
    CHECK(small_misaligned == 0);
    CHECK(overwritten == 0);

    // Ordinary traffic: containers, strings, exceptions (libstdc++
    // allocates exception objects with malloc).
    std::map<std::string, std::vector<int>> m;
    for (int i = 0; i < 20000; i++)
        m[std::to_string(i * 7919 % 10007)].push_back(i);
    int caught = 0;
    for (int i = 0; i < 1000; i++) {
        try {
            throw std::runtime_error(std::string(100, 'x'));
        } catch (const std::exception &ex) {
            caught += ex.what()[0] == 'x';
        }
    }
    CHECK(caught == 1000);
    CHECK(m.size() == 10007);
    return failures ? 1 : 0;
}
