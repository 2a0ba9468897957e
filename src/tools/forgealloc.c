/* forgealloc.c - the forgealloc command: run programs under libforgealloc.so
 * and look at its settings and results.
 *
 *   forgealloc run [--stats FMT] [--stats-file PATH] [--pool SIZE] [--] CMD...   (run.c)
 *   forgealloc env [--markdown] | version | system-preload [--remove]
 *   forgealloc doctor [BINARY] | report FILE.json [OTHER.json]
 *
 * Linked statically where the C library allows it: the dynamic loader never
 * runs for it, so a library preloaded by the caller (LD_PRELOAD,
 * /etc/ld.so.preload) is not loaded into it, and the environment it passes
 * on is the caller's, entry for entry.  `env` prints the option table
 * through the library's own parser (src/core/options.c); `doctor` and
 * `report` are scripts it starts (forgealloc-doctor, forgealloc.py). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "launcher.h"
#include "options.h"

extern char **environ;

/* Where the installed pieces lie, relative to the installed program
 * (CMake's bindir to libdir, libexecdir and datadir). */
#ifndef FA_BIN_TO_LIB
#define FA_BIN_TO_LIB "../lib"
#endif
#ifndef FA_BIN_TO_LIBEXEC
#define FA_BIN_TO_LIBEXEC "../libexec"
#endif
#ifndef FA_BIN_TO_DATA
#define FA_BIN_TO_DATA "../share"
#endif

int fa_die_status = 2;

_Noreturn void fa_leave(int status)
{
    fflush(stdout);
    _exit(status);
}

static void vnote(const char *fmt, va_list ap)
{
    fflush(stdout);
    fputs("forgealloc: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    fflush(stderr);
}

void fa_note(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vnote(fmt, ap);
    va_end(ap);
}

_Noreturn void fa_die_with(int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vnote(fmt, ap);
    va_end(ap);
    fa_leave(status);
}

char *fa_strf(const char *fmt, ...)
{
    char *s;
    va_list ap;
    va_start(ap, fmt);
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    if (n < 0)
        fa_die("out of memory");
    return s;
}

const char *fa_base_name(const char *path, char *storage, size_t cap)
{
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        n--;
    size_t start = n;
    while (start > 0 && path[start - 1] != '/')
        start--;
    if (n == 1 && path[0] == '/')
        start = 0;
    size_t len = n - start < cap - 1 ? n - start : cap - 1;
    memcpy(storage, path + start, len);
    storage[len] = '\0';
    return storage;
}

/* ---- the environment a program gets -------------------------------------- */

static size_t name_len(const char *entry) { return strcspn(entry, "="); }

static bool is_entry(const char *entry, const char *name, size_t n)
{
    return strncmp(entry, name, n) == 0 && entry[n] == '=';
}

void fa_env_init(fa_env *e)
{
    size_t n = 0;
    while (environ && environ[n])
        n++;
    e->cap = n + 8;
    e->v = malloc(e->cap * sizeof *e->v);
    if (!e->v)
        fa_die("out of memory");
    memcpy(e->v, environ, n * sizeof *e->v);
    e->n = n;
    e->v[n] = NULL;
}

void fa_env_set(fa_env *e, const char *name, const char *value)
{
    char *entry = fa_strf("%s=%s", name, value);
    size_t n = name_len(name);
    for (size_t i = 0; i < e->n; i++) {
        if (is_entry(e->v[i], name, n)) {
            /* Later entries of the name are dropped: the loader takes the
             * last LD_PRELOAD, getenv the first. */
            e->v[i] = entry;
            for (size_t j = e->n; j-- > i + 1;)
                if (is_entry(e->v[j], name, n)) {
                    memmove(&e->v[j], &e->v[j + 1], (e->n - j) * sizeof *e->v);
                    e->n--;
                }
            return;
        }
    }
    if (e->n + 1 >= e->cap) {
        e->cap *= 2;
        e->v = realloc(e->v, e->cap * sizeof *e->v);
        if (!e->v)
            fa_die("out of memory");
    }
    e->v[e->n++] = entry;
    e->v[e->n] = NULL;
}

/* ---- finding the pieces ----------------------------------------------------- */

/* The directory this program lies in, links resolved. */
static const char *here(void)
{
    static char *dir;
    if (dir)
        return dir;
    char *self = realpath("/proc/self/exe", NULL);
    if (!self)
        fa_die("cannot tell where this program lies (/proc is not mounted?)");
    *strrchr(self, '/') = '\0';
    dir = self[0] ? self : strdup("/");
    return dir;
}

static bool is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* The first of the candidates (NULL-terminated) that is a file, and
 * executable if asked, as an absolute path without links; or NULL. */
static char *first_file(const char *const *cands, bool executable)
{
    for (; *cands; cands++)
        if (is_file(*cands) && (!executable || access(*cands, X_OK) == 0))
            return realpath(*cands, NULL);
    return NULL;
}

char *fa_find_lib(char **why)
{
    const char *forced = getenv("FORGEALLOC_LIB");
    if (forced && forced[0]) {
        struct stat st;
        if (stat(forced, &st) != 0) {
            *why = fa_strf("FORGEALLOC_LIB=%s does not exist; unset it or point it at libforgealloc.so", forced);
            return NULL;
        }
        if (!S_ISREG(st.st_mode)) {
            *why = fa_strf("FORGEALLOC_LIB=%s is not a file; unset it or point it at libforgealloc.so", forced);
            return NULL;
        }
        return realpath(forced, NULL);
    }
    /* Installed (bin/ beside lib/), or the build tree (one directory). */
    const char *cands[] = {fa_strf("%s/" FA_BIN_TO_LIB "/libforgealloc.so", here()),
                           fa_strf("%s/libforgealloc.so", here()), NULL};
    char *lib = first_file(cands, false);
    if (!lib)
        *why = fa_strf("libforgealloc.so not found next to %s; build it (cmake --build build) or set FORGEALLOC_LIB",
                       here());
    return lib;
}

char *fa_need_lib(void)
{
    char *why = NULL, *lib = fa_find_lib(&why);
    if (!lib)
        fa_die("%s", why);
    return lib;
}

char *fa_find_query(const char *lib)
{
    char *libdir = strdup(lib);
    *strrchr(libdir, '/') = '\0';
    const char *cands[] = {fa_strf("%s/forgealloc-query", libdir),
                           fa_strf("%s/../libexec/forgealloc/forgealloc-query", libdir),
                           fa_strf("%s/../../libexec/forgealloc/forgealloc-query", libdir),
                           fa_strf("%s/" FA_BIN_TO_LIBEXEC "/forgealloc/forgealloc-query", here()),
                           fa_strf("%s/forgealloc-query", here()), NULL};
    return first_file(cands, true);
}

/* A script that comes with this program: installed in `installed` (relative
 * to the install prefix's bindir), or beside it in the build tree. */
static char *find_script(const char *installed, const char *name, bool executable)
{
    const char *cands[] = {fa_strf("%s/%s/forgealloc/%s", here(), installed, name), fa_strf("%s/%s", here(), name),
                           NULL};
    return first_file(cands, executable);
}

char *fa_path_search(const char *name, char **found)
{
    const char *dirs = getenv("PATH");
    if (!dirs)
        dirs = "/bin:/usr/bin";
    *found = NULL;
    for (const char *p = dirs;; p++) {
        size_t n = strcspn(p, ":");
        char *c = fa_strf("%.*s%s%s", (int)n, p, n ? "/" : "", name);
        struct stat st;
        if (stat(c, &st) == 0 && !S_ISDIR(st.st_mode)) {
            if (euidaccess(c, X_OK) == 0)
                return c;
            if (!*found)
                *found = c;
        }
        p += n;
        if (!*p)
            return NULL;
    }
}

/* ---- the loader's view of the library ----------------------------------- */

void fa_load_check(const char *lib)
{
    if (access("/bin/true", X_OK) != 0)
        return;
    fa_env e;
    fa_env_init(&e);
    fa_env_set(&e, "LD_PRELOAD", lib);
    fa_env_set(&e, "FORGEALLOC_STATS", "off");
    fa_env_set(&e, "FORGEALLOC_LOG", "error");
    fa_env_set(&e, "FORGEALLOC_STRICT", "0");
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0)
        return;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, p[1], 1);
    posix_spawn_file_actions_adddup2(&fa, p[1], 2);
    char *argv[] = {"/bin/true", NULL};
    pid_t pid;
    int err = posix_spawn(&pid, "/bin/true", &fa, NULL, argv, e.v);
    posix_spawn_file_actions_destroy(&fa);
    close(p[1]);
    char out[8192];
    size_t len = 0;
    for (;;) {
        char chunk[4096];
        ssize_t got = read(p[0], chunk, sizeof chunk);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        size_t keep = (size_t)got < sizeof out - 1 - len ? (size_t)got : sizeof out - 1 - len;
        memcpy(out + len, chunk, keep);
        len += keep;
    }
    out[len] = '\0';
    close(p[0]);
    int status = 0;
    if (err != 0)
        return; /* /bin/true could not be started: nothing is known */
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && !strstr(out, "cannot be preloaded"))
        return;
    /* "... error while loading shared libraries: libX.so: cannot open ..." */
    const char *m = strstr(out, "loading shared libraries: ");
    if (m) {
        const char *name = m + strlen("loading shared libraries: ");
        size_t n = strcspn(name, ":");
        if (n && strncmp(name + n, ": cannot open", 13) == 0) {
            if (strncmp(name, "libtcmalloc_minimal", 19) == 0)
                fa_die("%s needs %.*s, which is not installed; install it (apt-get install libtcmalloc-minimal4)", lib,
                       (int)n, name);
            fa_die("%s needs %.*s, which is not installed", lib, (int)n, name);
        }
    }
    /* "ERROR: ld.so: object 'X' from LD_PRELOAD cannot be preloaded (why): ignored." */
    char *why = fa_strf("%.*s", (int)strcspn(out, "\n"), out);
    const char *c = strstr(out, "cannot be preloaded (");
    if (c) {
        c += strlen("cannot be preloaded (");
        why = fa_strf("%.*s", (int)strcspn(c, ")"), c);
    }
    fa_die("%s cannot be preloaded (%s); set FORGEALLOC_LIB to a libforgealloc.so built for this system", lib, why);
}

/* ---- env ----------------------------------------------------------------------- */

static int cmd_env(int argc, char **argv)
{
    bool markdown = false;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            puts("usage: forgealloc env [--markdown]   every FORGEALLOC_* setting: default, current value, help");
            fa_leave(0);
        }
        if (strcmp(argv[i], "--markdown") != 0)
            fa_die("env: unknown option %s", argv[i]);
        markdown = true;
    }
    if (markdown) {
        puts("| variable | default | meaning |\n|---|---|---|");
        for (int i = 0; i < FA_OPT_COUNT; i++) {
            const fa_option_desc *d = &fa_option_table[i];
            printf("| `%s` | `%s` | ", d->name, d->def[0] ? d->def : "(unset)");
            for (const char *c = d->doc; *c; c++)
                putchar(*c == '|' ? '/' : *c);
            puts(" |");
        }
        fa_leave(0);
    }
    /* The settings as the library reads them, each bad one told in one
     * line by the library's own code. */
    fa_options_load(environ);
    int width = 0;
    for (int i = 0; i < FA_OPT_COUNT; i++)
        if ((int)strlen(fa_option_table[i].name) > width)
            width = (int)strlen(fa_option_table[i].name);
    for (int i = 0; i < FA_OPT_COUNT; i++) {
        const fa_option_desc *d = &fa_option_table[i];
        printf("%-*s  default %-10s now ", width, d->name, d->def[0] ? d->def : "(unset)");
        if (d->scope == FA_SCOPE_LIB) {
            char text[4200];
            fa_buf b;
            fa_buf_init(&b, text, sizeof text);
            fa_option_format(&b, (enum fa_opt_id)i);
            enum fa_opt_source src = fa_opt((enum fa_opt_id)i)->src;
            printf("%s  (%s)\n", text,
                   src == FA_SRC_ENV       ? "environment"
                   : src == FA_SRC_INVALID ? "invalid, default used"
                                           : "default");
        } else {
            puts("read by the launchers");
        }
        printf("%*s  %s\n", width, "", d->doc);
    }
    fa_leave(0);
}

/* ---- version, doctor, report: other programs, started in this process ---- */

/* The environment for a helper of ours that the library may be loaded
 * into (the caller's LD_PRELOAD): no dump, no warnings, no refusal. */
static void helper_env(fa_env *e)
{
    fa_env_init(e);
    fa_env_set(e, "FORGEALLOC_STATS", "off");
    fa_env_set(e, "FORGEALLOC_LOG", "error");
    fa_env_set(e, "FORGEALLOC_STRICT", "0");
}

static _Noreturn void exec_or_die(const char *path, char **argv, char **envp)
{
    execve(path, argv, envp);
    fa_die("cannot run %s: %s", path, strerror(errno));
}

static int cmd_version(void)
{
    char *lib = fa_need_lib();
    fa_load_check(lib);
    char *query = fa_find_query(lib);
    if (!query)
        fa_die("forgealloc-query not found next to %s; reinstall forgealloc (it comes with the library) or rebuild it "
               "(cmake --build build)",
               lib);
    fa_env e;
    helper_env(&e);
    fa_env_set(&e, "LD_PRELOAD", lib);
    char *argv[] = {query, "version", NULL};
    exec_or_die(query, argv, e.v);
}

static int cmd_doctor(int argc, char **argv)
{
    if (argc >= 1 && (strcmp(argv[0], "-h") == 0 || strcmp(argv[0], "--help") == 0)) {
        puts("usage: forgealloc doctor [BINARY]   checks whether the shim can work here; BINARY: can its CUDA calls be "
             "seen");
        fa_leave(0);
    }
    char *script = find_script(FA_BIN_TO_LIBEXEC, "forgealloc-doctor", true);
    if (!script)
        fa_die("forgealloc-doctor not found next to %s; reinstall forgealloc or rebuild it (cmake --build build)", here());
    char *why = NULL, *lib = fa_find_lib(&why), *query = lib ? fa_find_query(lib) : NULL;
    char **args = calloc((size_t)argc + 6, sizeof *args);
    int n = 0;
    args[n++] = script;
    args[n++] = lib ? fa_strf("--lib=%s", lib) : fa_strf("--no-lib=%s", why);
    if (query)
        args[n++] = fa_strf("--query=%s", query);
    args[n++] = "--";
    for (int i = 0; i < argc && i < 1; i++)
        args[n++] = argv[i];
    fa_env e;
    helper_env(&e);
    exec_or_die(script, args, e.v);
}

static int cmd_report(int argc, char **argv)
{
    if (argc >= 1 && (strcmp(argv[0], "-h") == 0 || strcmp(argv[0], "--help") == 0)) {
        puts("usage: forgealloc report FILE.json [OTHER.json]   a readable table of a JSON stats dump, or two side by "
             "side");
        fa_leave(0);
    }
    if (argc < 1 || argc > 2)
        fa_die("report: give one or two JSON stats files (FORGEALLOC_STATS=json)");
    char *other, *python = fa_path_search("python3", &other);
    if (!python)
        fa_die("this command needs python3; install it (apt-get install python3)");
    char *helper = find_script(FA_BIN_TO_DATA, "forgealloc.py", false);
    if (!helper)
        fa_die("forgealloc.py (the Python helper) not found next to %s", here());
    char *args[] = {"python3", helper, "report", argv[0], argc > 1 ? argv[1] : NULL, NULL};
    fa_env e;
    helper_env(&e);
    exec_or_die(python, args, e.v);
}

/* ---- system-preload ------------------------------------------------------------ */

/* The loader reads this file in every process, after LD_PRELOAD. */
static const char system_preload_file[] = "/etc/ld.so.preload";

/* Only inside a container: on a host the file would preload the library
 * into every process of the machine. */
static bool in_container(void)
{
    if (access("/.dockerenv", F_OK) == 0 || access("/run/.containerenv", F_OK) == 0)
        return true;
    const char *c = getenv("container"); /* podman, systemd-nspawn */
    if (c && c[0])
        return true;
    FILE *f = fopen("/proc/1/cgroup", "re");
    if (!f)
        return false;
    static const char *const kinds[] = {"/docker", "/containerd", "/kubepods", "/libpod", "/lxc"};
    char line[4096];
    bool found = false;
    while (!found && fgets(line, sizeof line, f))
        for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
            found |= strstr(line, kinds[i]) != NULL;
    fclose(f);
    return found;
}

static int cmd_system_preload(int argc, char **argv)
{
    bool remove = false;
    if (argc >= 1) {
        if (strcmp(argv[0], "-h") == 0 || strcmp(argv[0], "--help") == 0) {
            puts("usage: forgealloc system-preload [--remove]\n"
                 "\n"
                 "Adds libforgealloc.so, first, to /etc/ld.so.preload (--remove takes it out),\n"
                 "so that programs whose start script overwrites LD_PRELOAD still load it.\n"
                 "Only as root inside a container (never on a host: every process of the\n"
                 "machine would load it).  docker/entrypoint.sh runs it when\n"
                 "FORGEALLOC_PRELOAD=system.");
            fa_leave(0);
        }
        if (strcmp(argv[0], "--remove") != 0)
            fa_die("system-preload: unknown option %s (see forgealloc system-preload --help)", argv[0]);
        remove = true;
    }
    if (geteuid() != 0)
        fa_die_with(1, "system-preload needs root to write %s; run the container as root or leave FORGEALLOC_PRELOAD "
                       "unset (LD_PRELOAD only)",
                    system_preload_file);
    if (!in_container())
        fa_die_with(1, "system-preload works only inside a container (no /.dockerenv, /run/.containerenv or container "
                       "cgroup here); on a host it would preload into every process: use forgealloc run");
    char *lib = fa_need_lib();
    /* The entries there (separated by blanks, colons or lines), as written:
     * names, never patterns; ours dropped. */
    char *text = NULL;
    size_t cap = 0;
    FILE *in = fopen(system_preload_file, "re");
    if (in) {
        ssize_t got = getdelim(&text, &cap, '\0', in);
        fclose(in);
        if (got < 0) {
            free(text);
            text = NULL;
        }
    }
    char *tmp = fa_strf("%s.tmp-%d", system_preload_file, (int)getpid());
    FILE *out = fopen(tmp, "we");
    if (!out)
        fa_die_with(1, "cannot write %s", tmp);
    bool any = false;
    if (!remove) {
        fprintf(out, "%s\n", lib);
        any = true;
    }
    for (char *save = NULL, *entry = text ? strtok_r(text, " :\t\n", &save) : NULL; entry;
         entry = strtok_r(NULL, " :\t\n", &save)) {
        char base[NAME_MAX + 1];
        if (strncmp(fa_base_name(entry, base, sizeof base), "libforgealloc.so", 16) == 0)
            continue;
        fprintf(out, "%s\n", entry);
        any = true;
    }
    if (fclose(out) != 0) {
        unlink(tmp);
        fa_die_with(1, "cannot write %s", tmp);
    }
    if (!any) {
        unlink(tmp);
        if (unlink(system_preload_file) != 0 && errno != ENOENT)
            fa_die_with(1, "cannot remove %s", system_preload_file);
    } else if (chmod(tmp, 0644) != 0 || rename(tmp, system_preload_file) != 0) {
        unlink(tmp);
        fa_die_with(1, "cannot replace %s", system_preload_file);
    }
    fa_leave(0);
}

/* ---- main ------------------------------------------------------------------------ */

static void usage(FILE *to)
{
    fputs("usage: forgealloc COMMAND [ARGS]\n"
          "\n"
          "  run [--stats FMT] [--stats-file PATH] [--pool SIZE] -- CMD...\n"
          "                          run CMD with libforgealloc.so preloaded\n"
          "  env [--markdown]        every FORGEALLOC_* setting with default, value, help\n"
          "  doctor [BINARY]         can the shim work here (and see BINARY's CUDA calls)?\n"
          "  report FILE [OTHER]     a JSON stats dump as a table, or two compared\n"
          "  system-preload [--remove]\n"
          "                          (root, in a container) add the library to /etc/ld.so.preload\n"
          "  version                 the library's version\n"
          "\n"
          "Each command takes --help.  The library comes from FORGEALLOC_LIB or is found\n"
          "next to this program.\n",
          to);
}

int main(int argc, char **argv)
{
    const char *sub = argc > 1 ? argv[1] : "";
    int n = argc > 1 ? argc - 2 : 0;
    char **rest = argv + (argc > 1 ? 2 : 1);
    if (strcmp(sub, "run") == 0)
        return fa_cmd_run(n, rest);
    if (strcmp(sub, "env") == 0)
        return cmd_env(n, rest);
    if (strcmp(sub, "doctor") == 0)
        return cmd_doctor(n, rest);
    if (strcmp(sub, "report") == 0)
        return cmd_report(n, rest);
    if (strcmp(sub, "system-preload") == 0)
        return cmd_system_preload(n, rest);
    if (strcmp(sub, "version") == 0)
        return cmd_version();
    if (strcmp(sub, "-h") == 0 || strcmp(sub, "--help") == 0 || strcmp(sub, "help") == 0) {
        usage(stdout);
        fa_leave(0);
    }
    if (!sub[0]) {
        usage(stderr);
        fa_leave(2);
    }
    fa_die("unknown command '%s' (try forgealloc --help)", sub);
}
