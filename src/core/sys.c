/* sys.c - facts about the system the library reads once (sys.h). */
#include "sys.h"

#include <errno.h>

size_t fa_page_size(void)
{
    static size_t page;
    size_t p = __atomic_load_n(&page, __ATOMIC_RELAXED);
    if (!p) {
        int saved = errno;
        long v = sysconf(_SC_PAGESIZE);
        errno = saved;
        p = v > 0 ? (size_t)v : 4096;
        __atomic_store_n(&page, p, __ATOMIC_RELAXED);
    }
    return p;
}
