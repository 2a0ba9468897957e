/* lookup.h - dlsym and dlvsym through a handle on libc, for libc's
 * malloc-family names.
 *
 * A lookup through a handle searches that object and its dependencies,
 * never the global scope: dlsym(dlopen("libc.so.6"), "malloc_trim") (what
 * Python's ctypes.CDLL("libc.so.6").malloc_trim does) finds glibc's own
 * function even where a preloaded allocator serves every malloc, so it
 * trims glibc's empty arena, mallinfo2 reports it, and free of a block the
 * allocator made aborts.  Where such a lookup lands in glibc and the name is
 * one the library defines for libc's malloc family, the answer is the
 * definition the program's own call binds to: dlsym(RTLD_DEFAULT, name),
 * so an allocator preloaded ahead of forgealloc stays in charge.  The
 * object that makes that definition itself gets glibc's (it asks libc for
 * the function under its own).  Every other lookup is glibc's, untouched.
 *
 * dlsym and dlvsym themselves (override_dl.S) ask fa_lookup_route_* where
 * to go and jump there with the caller's own return address: the real
 * functions read it to know whose RTLD_NEXT and RTLD_DEFAULT they serve. */
#ifndef FA_LOOKUP_H
#define FA_LOOKUP_H

#include <stdbool.h>

#include "../core/export.h"

/* FA_LIBC_MALLOC(name), before a definition in the override files: the
 * name is one of libc's malloc family.  It is exported, and it joins the
 * one table of those names: a section of the library with one entry per
 * marked definition, so the table cannot drift from what is defined. */
#define FA_LIBC_MALLOC(name)                                                                                     \
    static const char *const fa_libc_malloc_##name __attribute__((section("fa_libc_malloc"), used)) = #name;  \
    FA_EXPORT

/* Whether the library defines `name` as one of libc's malloc family. */
bool fa_libc_malloc_name(const char *name);

/* The function a call of dlsym(handle, name) or dlvsym(handle, name,
 * version) continues in, with its arguments as they are: the next
 * definition of dlsym or dlvsym (glibc's, unless a library after
 * forgealloc in the lookup order defines one), or the answer for a libc
 * handle.  Keeps errno. */
void *fa_lookup_route_sym(void *handle, const char *name);
void *fa_lookup_route_vsym(void *handle, const char *name, const char *version);

#endif
