/* launcher.h - what the parts of the forgealloc command share: its own
 * errors, where its pieces lie, and the environment a program it starts
 * gets (the caller's, entry for entry, with only the names it sets
 * changed). */
#ifndef FA_LAUNCHER_H
#define FA_LAUNCHER_H

#include <stdbool.h>
#include <stddef.h>

/* The status of the command's own errors: 2, and 125 in `run` (as env,
 * nice or timeout: never taken for the status of the program it runs). */
extern int fa_die_status;

/* "forgealloc: MESSAGE" on stderr, then exit with `status`. */
_Noreturn void fa_die_with(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define fa_die(...) fa_die_with(fa_die_status, __VA_ARGS__)
/* "forgealloc: MESSAGE" on stderr. */
void fa_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Ends the command without the exit handlers of anything loaded into it. */
_Noreturn void fa_leave(int status);

/* malloc'd "fmt..." (exits on out of memory). */
char *fa_strf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* libforgealloc.so: FORGEALLOC_LIB, else the install prefix or build tree
 * this program lies in, as an absolute path without links.  NULL with
 * *why set (malloc'd) when there is none. */
char *fa_find_lib(char **why);
/* fa_find_lib, dying with its reason. */
char *fa_need_lib(void);
/* forgealloc-query next to the library `lib` or this program, or NULL. */
char *fa_find_query(const char *lib);

/* As execvp looks for `name` (no '/'): the first executable file of that
 * name on PATH (unset: /bin:/usr/bin; an empty entry is the current
 * directory), or NULL with *found set to the first file of that name that
 * is not executable, or NULL. */
char *fa_path_search(const char *name, char **found);

/* Runs `lib` in /bin/true, as every process of a command would load it;
 * dies with one line saying why when the loader cannot preload it. */
void fa_load_check(const char *lib);

/* A name's last part: "/a/b/" -> "b" (as basename(1)), into storage. */
const char *fa_base_name(const char *path, char *storage, size_t cap);

/* ---- an environment for execve --------------------------------------- */

typedef struct fa_env {
    char **v; /* NULL-terminated */
    size_t n, cap;
} fa_env;

/* The caller's environment as it came, every entry in its place. */
void fa_env_init(fa_env *e);
/* NAME=VALUE in place of the first NAME entry (later ones dropped), or
 * appended. */
void fa_env_set(fa_env *e, const char *name, const char *value);

/* The subcommand run, in run.c. */
int fa_cmd_run(int argc, char **argv);

#endif
