/* gotcall.c - a library that calls memset through its PLT or GOT, built
 * three ways (lazy binding, full RELRO, -fno-plt) for test_startfill. */
#include <stddef.h>
#include <string.h>

__attribute__((visibility("default"))) void *GOTCALL_NAME(void *p, int c, size_t n);
void *GOTCALL_NAME(void *p, int c, size_t n) { return memset(p, c, n); }
