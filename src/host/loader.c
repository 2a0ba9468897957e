/* loader.c - ld.so's address range (loader.h). */
#define _GNU_SOURCE
#include "loader.h"

#include <link.h>
#include <stdint.h>

/* ld.so defines __tls_get_addr on every glibc target we build for. */
extern void *__tls_get_addr(void *);

static uintptr_t lo, hi; /* [lo, hi): ld.so's loaded segments */

static int find(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    uintptr_t want = (uintptr_t)arg, a = UINTPTR_MAX, b = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD)
            continue;
        uintptr_t s = info->dlpi_addr + ph->p_vaddr, e = s + ph->p_memsz;
        a = s < a ? s : a;
        b = e > b ? e : b;
    }
    if (want < a || want >= b)
        return 0;
    __atomic_store_n(&lo, a, __ATOMIC_RELAXED);
    __atomic_store_n(&hi, b, __ATOMIC_RELEASE);
    return 1;
}

void fa_loader_init(void)
{
    if (__atomic_load_n(&hi, __ATOMIC_ACQUIRE) == 0)
        dl_iterate_phdr(find, (void *)(uintptr_t)&__tls_get_addr);
}

bool fa_from_loader(const void *ret)
{
    uintptr_t r = (uintptr_t)ret, h = __atomic_load_n(&hi, __ATOMIC_ACQUIRE);
    return r < h && r >= __atomic_load_n(&lo, __ATOMIC_RELAXED);
}
