/* p_ownmalloc.c - a program with its own malloc (as programs that link an
 * allocator statically do): it serves every malloc of the process, ahead of
 * any preload.  Forwards to glibc's entry point. */
#include <stddef.h>
#include <stdio.h>

extern void *__libc_malloc(size_t n);

/* Exported (the build hides symbols by default), as the global lookup needs. */
__attribute__((visibility("default"))) void *malloc(size_t n) { return __libc_malloc(n); }

int main(void)
{
    void *p = malloc(100);
    puts(p ? "ok" : "failed");
    return p ? 0 : 1;
}
