/* forward.c - the least an interposer adds to plain tcmalloc: malloc, free,
 * calloc and realloc enter this library and jump on into tcmalloc (one
 * indirect jump each, built with -fno-plt), with nothing counted or
 * checked.  Every other name (memalign, operator new and delete, ...) is
 * tcmalloc's own, found after this library.  The bench's
 * `tcmalloc+forward` preloads it beside the small-object rows, so the
 * cost of interposing at all and forgealloc's cost on top of it read
 * apart (tests/bench/README.md).
 *
 * build: cc -O2 -fPIC -shared -fno-plt -o libforward.so forward.c \
 *            /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 */
#include <stddef.h>

void *tc_malloc(size_t size);
void tc_free(void *p);
void *tc_calloc(size_t n, size_t size);
void *tc_realloc(void *p, size_t size);

void *malloc(size_t size) { return tc_malloc(size); }
void free(void *p) { tc_free(p); }
void *calloc(size_t n, size_t size) { return tc_calloc(n, size); }
void *realloc(void *p, size_t size) { return tc_realloc(p, size); }
