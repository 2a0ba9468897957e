/* dynsym.h - a loaded library found by name, and a definition read from its
 * dynamic symbol table, without dlsym: for where dlsym itself is the
 * function looked for (a library that defines dlsym cannot ask for the next
 * one with a call that would bind to its own). */
#ifndef FA_DYNSYM_H
#define FA_DYNSYM_H

#include <link.h>
#include <stdbool.h>

/* The first loaded object (in the loader's order: the program's own
 * namespace first) whose file name ends in "/soname" or is soname, into
 * out.  False if none is loaded.  The pointers in out stay valid while the
 * object stays loaded.  Takes the loader's lock (dl_iterate_phdr): not
 * from a signal handler. */
bool fa_dynsym_object(const char *soname, struct dl_phdr_info *out);

/* The address of the definition of `name` in obj's own dynamic symbol
 * table (GNU or SysV hash), at its default version: the one an unversioned
 * reference binds to.  NULL if obj defines no such symbol, or only at a
 * hidden version, or as an indirect function (its resolver is not run).
 * Does not allocate; no lock. */
void *fa_dynsym_lookup(const struct dl_phdr_info *obj, const char *name);

#endif
