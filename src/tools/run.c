/* run.c - `forgealloc run`: CMD in this very process (execve: same PID,
 * signals reach it) with libforgealloc.so first in LD_PRELOAD and the stats
 * defaults, the caller's environment otherwise passed on entry for entry.
 * With --wait-group it stays as CMD's parent instead, for an init that
 * signals the whole process group (tini -g), and waits for the rest of the
 * group once CMD has been stopped. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "launcher.h"
#include "options.h"

static void usage(void)
{
    fputs("usage: forgealloc run [--stats FMT] [--stats-file PATH] [--pool SIZE] [--] CMD [ARG...]\n"
          "\n"
          "Runs CMD (same PID, signals reach it) with libforgealloc.so preloaded first\n"
          "in LD_PRELOAD by absolute path.  Entries already in LD_PRELOAD are kept,\n"
          "ours is never added twice, other malloc replacements are left out.\n"
          "\n"
          "  --stats FMT        exit dump format: off, text, json, prometheus (default:\n"
          "                     FORGEALLOC_STATS, else text)\n"
          "  --stats-file PATH  where dumps go; %p becomes the pid, %h the hostname,\n"
          "                     %t the start time (without %p every process writes\n"
          "                     PATH: the last to exit, usually CMD, wins).  Default:\n"
          "                     CMD writes its dump to stderr and its child processes\n"
          "                     to $FORGEALLOC_STATS_DIR/<host>-<start>-<pid>.txt (.json, .prom)\n"
          "                     ($TMPDIR/forgealloc-$UID unless set)\n"
          "  --pool SIZE        device pool per GPU (FORGEALLOC_DEVICE_POOL_SIZE), e.g.\n"
          "                     2G, 25% or 0 for pass-through\n"
          "  --wait-group       stay as CMD's parent (for an init that signals the whole\n"
          "                     process group, as tini -g): once CMD has ended after a\n"
          "                     HUP, INT, QUIT or TERM, wait for the rest of its process\n"
          "                     group (a start script's Python) before exiting with\n"
          "                     CMD's status; a second such signal ends the wait\n"
          "  --wait-group=auto  the same where the parent is tini or docker-init that\n"
          "                     signals this process's group (-g, TINI_KILL_PROCESS_GROUP)\n"
          "                     and this process leads the group; else CMD is exec'd\n"
          "                     (docker/entrypoint.sh passes it)\n"
          "\n"
          "Exit status: CMD's.  When run cannot start CMD it says why in one line and\n"
          "exits 125 (its own error: a bad option or setting, the library missing or\n"
          "not loadable), 126 (CMD not executable) or 127 (CMD not found).\n",
          stdout);
}

/* ---- the command --------------------------------------------------------------- */

static bool executable(const char *path) { return euidaccess(path, X_OK) == 0; }

/* The command as execve will find it, checked first: a failure is told in
 * one line with a shell's status (127 not found, 126 not executable). */
static char *command_path(const char *cmd)
{
    char *path = NULL;
    struct stat st;
    if (strchr(cmd, '/')) {
        if (stat(cmd, &st) != 0)
            fa_die_with(127, "run: %s does not exist", cmd);
        path = strdup(cmd);
    } else {
        /* The first executable file of that name on PATH, else the first
         * file of that name (not executable: said below). */
        char *other;
        path = fa_path_search(cmd, &other);
        if (!path)
            path = other;
        if (!path)
            fa_die_with(127, "run: %s: command not found on PATH", cmd);
    }
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        fa_die_with(126, "run: %s is a directory, not a program", cmd);
    if (!executable(path))
        fa_die_with(126, "run: %s is not executable (chmod +x it, or name its interpreter: forgealloc run -- sh %s)", cmd,
                    cmd);
    /* A script's interpreter (#!/path) must exist too. */
    FILE *f = fopen(path, "re");
    char line[4096];
    if (f && fgets(line, sizeof line, f) && strncmp(line, "#!", 2) == 0) {
        char *interp = line + 2 + strspn(line + 2, " \t");
        interp[strcspn(interp, " \t\n")] = '\0';
        size_t n = strlen(interp);
        if (n && interp[n - 1] == '\r')
            interp[n - 1] = '\0';
        if (interp[0] && !executable(interp))
            fa_die_with(127, "run: %s starts with #!%s, which does not exist", cmd, interp);
    }
    if (f)
        fclose(f);
    return path;
}

/* ---- LD_PRELOAD ------------------------------------------------------------------ */

/* Other malloc replacements: preloading two allocators makes them free each
 * other's pointers. */
static bool other_allocator(const char *entry)
{
    static const char *const names[] = {"libtcmalloc", "libjemalloc", "libmimalloc", "libhoard",
                                        "libtbbmalloc", "libsnmalloc", "libscudo"};
    char base[NAME_MAX + 1];
    fa_base_name(entry, base, sizeof base);
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strncmp(base, names[i], strlen(names[i])) == 0)
            return true;
    return false;
}

/* Our library first, by absolute path, then the entries already there (the
 * loader separates them by blanks or colons), without ours again and
 * without other allocators (each left out with one line). */
static char *compose_preload(const char *lib, const char *current)
{
    char *out = strdup(lib);
    char *copy = strdup(current ? current : "");
    for (char *save = NULL, *entry = strtok_r(copy, " :", &save); entry; entry = strtok_r(NULL, " :", &save)) {
        char base[NAME_MAX + 1];
        if (strncmp(fa_base_name(entry, base, sizeof base), "libforgealloc.so", 16) == 0)
            continue;
        char *real = realpath(entry, NULL);
        bool ours = real && strcmp(real, lib) == 0;
        free(real);
        if (ours)
            continue;
        if (other_allocator(entry)) {
            fa_note("leaving %s out of LD_PRELOAD: forgealloc already replaces malloc (two allocators would free each "
                    "other's memory)",
                    entry);
            continue;
        }
        char *next = fa_strf("%s:%s", out, entry);
        free(out);
        out = next;
    }
    free(copy);
    return out;
}

/* ---- where stats go --------------------------------------------------------------- */

/* The current directory as a shell knows it (PWD where it names this
 * directory), for paths a child started elsewhere must find; NULL where it
 * was removed. */
static const char *cwd(void)
{
    static char *dir;
    static bool known;
    if (known)
        return dir;
    known = true;
    const char *pwd = getenv("PWD");
    struct stat a, b;
    if (pwd && pwd[0] == '/' && stat(pwd, &a) == 0 && stat(".", &b) == 0 && a.st_dev == b.st_dev &&
        a.st_ino == b.st_ino)
        dir = strdup(pwd);
    else
        dir = getcwd(NULL, 0);
    return dir;
}

/* `path` from the current directory, where it is relative and one is known. */
static char *absolute(const char *path)
{
    return path[0] == '/' || !cwd() ? strdup(path) : fa_strf("%s/%s", cwd(), path);
}

/* `text` with each % doubled: a directory's name in a stats path pattern. */
static char *literal(const char *text)
{
    char *out = malloc(2 * strlen(text) + 1), *o = out;
    for (; *text; text++) {
        if (*text == '%')
            *o++ = '%';
        *o++ = *text;
    }
    *o = '\0';
    return out;
}

static bool is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool writable(const char *path) { return euidaccess(path, W_OK) == 0; }

/* mkdir -p DIR && chmod 700 DIR */
static bool make_dir(const char *dir)
{
    char *p = strdup(dir);
    for (char *s = p + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST) {
            free(p);
            return false;
        }
        *s = '/';
    }
    free(p);
    if (mkdir(dir, 0777) != 0 && !(errno == EEXIST && is_dir(dir)))
        return false;
    return chmod(dir, 0700) == 0;
}

/* The one place that decides where stats go when nobody said (run and,
 * through it, docker/entrypoint.sh): the command itself reports on stderr;
 * its children (git, pip, compilers...) each to their own file in
 * FORGEALLOC_STATS_DIR, never to the console.  The name holds the hostname
 * (the container id under Docker), the start time and the pid: pids repeat
 * across containers and restarts that share the directory.  Returns
 * whether FORGEALLOC_STATS_MAIN_PID was set to this process. */
static bool default_stats_file(fa_env *e, uint64_t format)
{
    const char *t = getenv("TMPDIR");
    char *tmp = absolute(t && t[0] ? t : "/tmp");
    char *fallback = fa_strf("%s/forgealloc-%u", tmp, (unsigned)geteuid());
    const char *d = getenv("FORGEALLOC_STATS_DIR");
    char *dir = d && d[0] ? absolute(d) : strdup(fallback);
    if (!(is_dir(dir) || make_dir(dir)) || !writable(dir)) {
        if (strcmp(dir, fallback) != 0) {
            fa_note("FORGEALLOC_STATS_DIR=%s is not writable; stats files go to %s (set FORGEALLOC_STATS_DIR to a "
                    "writable directory)",
                    dir, fallback);
            dir = strdup(fallback);
            if (!is_dir(dir))
                make_dir(dir);
        }
    }
    /* The fallback is a name anyone can take first in a shared /tmp: only a
     * directory of this user's own, not a link, that it can write. */
    struct stat st, lst;
    if (strcmp(dir, fallback) == 0 &&
        ((lstat(dir, &lst) == 0 && S_ISLNK(lst.st_mode)) || stat(dir, &st) != 0 || st.st_uid != geteuid() ||
         !writable(dir))) {
        char *fresh = fa_strf("%s/forgealloc-%u.XXXXXX", tmp, (unsigned)geteuid());
        if (!mkdtemp(fresh)) {
            fa_note("no directory for stats files (%s cannot be made or is not this user's): child processes write "
                    "theirs to stderr; set FORGEALLOC_STATS_DIR",
                    fallback);
            return false;
        }
        fa_note("%s is not a directory of this user's; stats files go to %s (set FORGEALLOC_STATS_DIR to choose)",
                fallback, fresh);
        dir = fresh;
    }
    const char *ext = format == FA_STATS_JSON ? "json" : format == FA_STATS_PROMETHEUS ? "prom" : "txt";
    fa_env_set(e, "FORGEALLOC_STATS_FILE", fa_strf("%s/%%h-%%t-%%p.%s", literal(dir), ext));
    fa_env_set(e, "FORGEALLOC_STATS_MAIN_PID", fa_strf("%d", (int)getpid()));
    /* A program that runs commands all day (a UI polling nvidia-smi) would
     * fill the directory: the oldest files go beyond this many. */
    const char *keep = getenv("FORGEALLOC_STATS_KEEP");
    fa_env_set(e, "FORGEALLOC_STATS_KEEP", keep && keep[0] ? keep : "1000");
    return true;
}

/* The value of a setting as the library reads it, with its own parser:
 * false where it is not one. */
static bool setting(enum fa_opt_id id, const char *text, fa_optval *v)
{
    const char *expected;
    return text && fa_option_parse(&fa_option_table[id], text, v, &expected);
}

/* ---- PID 1 and tini -------------------------------------------------------------- */

/* As PID 1 (a container started without an init: neither tini in the image
 * nor docker run --init; the entrypoint puts tini in front where it is
 * installed), the command never gets a signal it leaves at its default
 * action: docker stop's SIGTERM does nothing, and Docker kills it 10 s
 * later, without its stats.  One line says so, unless the command is an
 * init itself or FORGEALLOC_LOG=error. */
static void pid1_note(const char *cmd)
{
    if (getpid() != 1)
        return;
    fa_optval log;
    if (setting(FA_OPT_LOG, getenv("FORGEALLOC_LOG"), &log) && log.u == FA_LOG_ERROR)
        return;
    const char *base = strrchr(cmd, '/') ? strrchr(cmd, '/') + 1 : cmd;
    static const char *const inits[] = {"docker-init", "dumb-init", "catatonit", "s6-svscan",
                                        "runsvdir",    "supervisord", "systemd", "init"};
    if (strncmp(base, "tini", 4) == 0)
        return;
    for (size_t i = 0; i < sizeof inits / sizeof inits[0]; i++)
        if (strcmp(base, inits[i]) == 0)
            return;
    fa_note("run: %s runs as PID 1 with no init, where SIGTERM (docker stop) does nothing unless it handles it: Docker "
            "kills it 10 s later, without its stats; start the container with docker run --init, or with tini as its "
            "ENTRYPOINT (FORGEALLOC_LOG=error hides this line)",
            cmd);
}

/* A /proc file of the parent, whole (NUL-separated for environ, cmdline). */
static char *parent_file(const char *what, size_t *len)
{
    char *path = fa_strf("/proc/%d/%s", (int)getppid(), what);
    FILE *f = fopen(path, "re");
    free(path);
    if (!f)
        return NULL;
    char *text = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? 2 * cap : 8192;
            text = realloc(text, cap);
        }
        size_t got = fread(text + n, 1, 4096, f);
        n += got;
        if (got == 0)
            break;
    }
    fclose(f);
    text[n] = '\0';
    *len = n;
    return text;
}

/* Whether the parent is tini (or Docker's docker-init, a tini) sending its
 * signals to this process's group, with this process leading it (tini
 * makes its child a group leader): what --wait-group=auto waits for.  tini
 * sends to the group with -g on its command line, which getopt takes from
 * anywhere before `--` (-p, -e and -R take a value), or with
 * TINI_KILL_PROCESS_GROUP in its environment, whatever its value. */
static bool under_group_tini(void)
{
    size_t len;
    char *comm = parent_file("comm", &len);
    if (!comm)
        return false;
    comm[strcspn(comm, "\n")] = '\0';
    if (strncmp(comm, "tini", 4) != 0 && strcmp(comm, "docker-init") != 0)
        return false;
    if (getpgrp() != getpid())
        return false;
    /* (Another user's environ cannot be read: then the command line decides.) */
    char *env = parent_file("environ", &len);
    for (size_t i = 0; env && i < len; i += strlen(env + i) + 1)
        if (strncmp(env + i, "TINI_KILL_PROCESS_GROUP=", 24) == 0)
            return true;
    char *args = parent_file("cmdline", &len);
    if (!args)
        return false;
    bool value = false;
    size_t i = strlen(args) + 1; /* after the program's name */
    for (; i < len; i += strlen(args + i) + 1) {
        const char *word = args + i;
        if (value) {
            value = false;
            continue;
        }
        if (strcmp(word, "--") == 0)
            return false;
        if (word[0] != '-' || word[1] == '-' || word[1] == '\0')
            continue;
        for (const char *c = word + 1; *c; c++) {
            if (*c == 'g')
                return true;
            if (strchr("peR", *c)) {
                value = c[1] == '\0'; /* the value follows, or is the rest of the word */
                break;
            }
        }
    }
    return false;
}

/* ---- starting the command ------------------------------------------------------ */

static _Noreturn void exec_command(const char *path, char **argv, char **envp)
{
    execve(path, argv, envp);
    if (errno == ENOEXEC) {
        /* A script without #!: the shell runs it, as execvp has it. */
        int n = 0;
        while (argv[n])
            n++;
        char **sh = calloc((size_t)n + 2, sizeof *sh);
        sh[0] = "/bin/sh";
        sh[1] = (char *)path;
        for (int i = 1; i < n; i++)
            sh[i + 1] = argv[i];
        execve("/bin/sh", sh, envp);
    }
    fa_die_with(errno == ENOENT ? 127 : 126, "run: cannot run %s: %s", argv[0], strerror(errno));
}

/* Signals that stop a command, and the others a process-group tini passes
 * on, which would end or stop the waiting launcher. */
static const int stop_signals[] = {SIGHUP, SIGINT, SIGQUIT, SIGTERM};
static const int passed_signals[] = {SIGUSR1, SIGUSR2, SIGPIPE,   SIGALRM, SIGSTKFLT, SIGXCPU,
                                     SIGXFSZ, SIGVTALRM, SIGPROF, SIGIO,   SIGPWR,    SIGTSTP};

static bool is_stop_signal(int sig)
{
    for (size_t i = 0; i < sizeof stop_signals / sizeof stop_signals[0]; i++)
        if (stop_signals[i] == sig)
            return true;
    return false;
}

/* Every signal the launcher catches while it waits (a tini -g sends it to
 * the group, so the command gets it too): into `set`. */
static void waited_signals(sigset_t *set)
{
    sigemptyset(set);
    for (size_t i = 0; i < sizeof stop_signals / sizeof stop_signals[0]; i++)
        sigaddset(set, stop_signals[i]);
    for (size_t i = 0; i < sizeof passed_signals / sizeof passed_signals[0]; i++)
        sigaddset(set, passed_signals[i]);
    for (int s = SIGRTMIN; s <= SIGRTMAX; s++)
        sigaddset(set, s);
}

static void on_signal(int sig) { (void)sig; }

/* The command's status, once it has ended: what a second stop signal
 * during the wait for the rest of its group exits with. */
static volatile sig_atomic_t command_status;

static void on_second_stop(int sig)
{
    (void)sig;
    _exit(command_status);
}

/* run --wait-group (docker/entrypoint.sh under tini -g): a start script
 * that runs Python as a child (webui.sh) dies of `docker stop`'s SIGTERM at
 * once, while Python still handles it; as tini's child, its end would end
 * tini and the container, the kernel killing Python in the middle of its
 * shutdown and its dump.  So the launcher stays between tini and the
 * command, in its process group, where tini's signals reach every process
 * as before.  When the command dies of a signal that stops it, the
 * launcher waits for the rest of the group, then exits with the command's
 * status.  A further such signal ends the wait, as does Docker's SIGKILL
 * after its grace period. */
static _Noreturn void run_waiting(const char *path, char **argv, fa_env *e, bool main_pid_ours)
{
    /* Processes of the group whose parent ends (Python, once the start
     * script is gone) become the launcher's children: waited for below,
     * and reaped meanwhile as an init would. */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    /* Caught, by a handler that does nothing, from before the fork: a
     * signal for the group is never lost to the command, which takes each
     * at its default action (execve resets caught signals; the child
     * resets them itself before it unblocks them, so one that came after
     * the fork waits until then).  One the caller left ignored stays
     * ignored, for both. */
    sigset_t waited, old_mask;
    waited_signals(&waited);
    sigprocmask(SIG_BLOCK, &waited, &old_mask);
    struct sigaction noop = {.sa_handler = on_signal}, dfl = {.sa_handler = SIG_DFL}, child_old;
    sigfillset(&noop.sa_mask);
    bool caught[_NSIG] = {false};
    for (int s = 1; s < _NSIG; s++) {
        struct sigaction was;
        if (!sigismember(&waited, s) || sigaction(s, NULL, &was) != 0 || was.sa_handler == SIG_IGN)
            continue;
        caught[s] = sigaction(s, &noop, NULL) == 0;
    }
    /* waitpid needs the children's status, which SIGCHLD ignored would
     * throw away; the command gets the caller's setting back. */
    sigaction(SIGCHLD, &dfl, &child_old);
    pid_t child = fork();
    if (child < 0)
        fa_die("run: cannot start %s: %s", argv[0], strerror(errno));
    if (child == 0) {
        for (int s = 1; s < _NSIG; s++)
            if (caught[s])
                sigaction(s, &dfl, NULL);
        sigaction(SIGCHLD, &child_old, NULL);
        if (main_pid_ours)
            fa_env_set(e, "FORGEALLOC_STATS_MAIN_PID", fa_strf("%d", (int)getpid()));
        sigprocmask(SIG_SETMASK, &old_mask, NULL);
        exec_command(path, argv, e->v);
    }
    sigprocmask(SIG_SETMASK, &old_mask, NULL);

    int status = 0;
    for (;;) {
        pid_t pid = waitpid(-1, &status, 0);
        if (pid == child)
            break;
        if (pid < 0 && errno != EINTR)
            fa_die("run: lost %s: %s", argv[0], strerror(errno));
    }
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
    if (!WIFSIGNALED(status) || !is_stop_signal(WTERMSIG(status)))
        fa_leave(code);
    /* The signal that stopped the command has reached this process too,
     * and its handler has run by now (it was pending before the command
     * could end): only a further one ends the wait. */
    command_status = code;
    struct sigaction second = {.sa_handler = on_second_stop};
    sigfillset(&second.sa_mask);
    for (size_t i = 0; i < sizeof stop_signals / sizeof stop_signals[0]; i++)
        if (caught[stop_signals[i]])
            sigaction(stop_signals[i], &second, NULL);
    while (waitpid(-getpgrp(), &status, 0) >= 0 || errno == EINTR)
        ;
    fa_leave(code);
}

/* ---- run ------------------------------------------------------------------------- */

/* The value of an option: in the same word after '=', or the next one. */
static const char *option_value(int argc, char **argv, int *i, const char *name, const char *missing)
{
    size_t n = strlen(name);
    if (argv[*i][n] == '=')
        return argv[*i] + n + 1;
    if (*i + 1 >= argc)
        fa_die("%s", missing);
    return argv[++*i];
}

static bool is_option(const char *arg, const char *name)
{
    size_t n = strlen(name);
    return strncmp(arg, name, n) == 0 && (arg[n] == '\0' || arg[n] == '=');
}

int fa_cmd_run(int argc, char **argv)
{
    fa_die_status = 125;
    const char *stats = "", *stats_file = "", *pool = "";
    enum { NO_WAIT, WAIT, WAIT_AUTO } wait = NO_WAIT;
    int i = 0;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--wait-group") == 0)
            wait = WAIT;
        else if (strcmp(a, "--wait-group=auto") == 0)
            wait = WAIT_AUTO;
        else if (strncmp(a, "--wait-group=", 13) == 0)
            fa_die("run: %s: use --wait-group or --wait-group=auto", a);
        else if (is_option(a, "--stats"))
            stats = option_value(argc, argv, &i, "--stats", "--stats needs a format: off, text, json or prometheus");
        else if (is_option(a, "--stats-file"))
            stats_file = option_value(argc, argv, &i, "--stats-file", "--stats-file needs a path");
        else if (is_option(a, "--pool"))
            pool = option_value(argc, argv, &i, "--pool", "--pool needs a size such as 2G, 25% or 0");
        else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage();
            fa_leave(0);
        } else if (strcmp(a, "--") == 0) {
            i++;
            break;
        } else if (a[0] == '-')
            fa_die("run: unknown option %s (see forgealloc run --help)", a);
        else
            break;
    }
    if (i >= argc)
        fa_die("run: no command given (usage: forgealloc run [OPTIONS] -- CMD...)");
    char **cmd = argv + i;
    /* --stats is read as the library reads FORGEALLOC_STATS (blanks alone:
     * not given), and passed on by its name. */
    fa_optval format = {.u = FA_STATS_TEXT};
    char name[32] = "";
    if (stats[strspn(stats, " \t")]) {
        if (!setting(FA_OPT_STATS, stats, &format))
            fa_die("--stats %s: use off, text, json or prometheus", stats);
        fa_buf b;
        fa_buf_init(&b, name, sizeof name);
        fa_option_format_value(&b, FA_OPT_STATS, &format);
    }
    stats = name;

    char *path = command_path(cmd[0]);
    char *lib = fa_need_lib();
    /* LD_PRELOAD holds paths separated by blanks or colons. */
    if (lib[strcspn(lib, " \t\n\v\f\r:")])
        fa_die("the library's path '%s' has a space or colon, which LD_PRELOAD cannot hold; install or copy it to a "
               "path without them and set FORGEALLOC_LIB",
               lib);
    fa_load_check(lib);
    /* --pool is read by the library, with this very parser. */
    if (pool[0]) {
        fa_optval v;
        const char *expected;
        if (!fa_option_parse(&fa_option_table[FA_OPT_DEVICE_POOL_SIZE], pool, &v, &expected))
            fa_die("--pool %s: use a size or a percentage of the GPU's memory from 0%% to 100%% (4G, 512MiB, 40%%; 0 = "
                   "no pool)",
                   pool);
    }

    fa_env e;
    fa_env_init(&e);
    char *preload = compose_preload(lib, getenv("LD_PRELOAD"));
    if (!stats[0]) {
        /* The caller's setting, as it is (one the library refuses is not
         * off: it says so, and the files are .txt). */
        const char *caller = getenv("FORGEALLOC_STATS");
        stats = caller && caller[0] ? caller : "text";
        if (!setting(FA_OPT_STATS, stats, &format))
            format.u = FA_STATS_TEXT;
    }
    if (pool[0])
        fa_env_set(&e, "FORGEALLOC_DEVICE_POOL_SIZE", pool);
    const char *caller_file = getenv("FORGEALLOC_STATS_FILE");
    bool main_pid_ours = false;
    if (!stats_file[0] && caller_file && caller_file[0])
        stats_file = caller_file;
    else if (!stats_file[0] && format.u != FA_STATS_OFF)
        main_pid_ours = default_stats_file(&e, format.u);
    if (stats_file[0]) {
        /* From here: a child started in another directory writes here too
         * (a % in this directory's name stands for itself). */
        if (stats_file[0] != '/' && strcmp(stats_file, "-") != 0 && cwd())
            stats_file = fa_strf("%s/%s", literal(cwd()), stats_file);
        fa_env_set(&e, "FORGEALLOC_STATS_FILE", stats_file);
    }
    if (wait == WAIT_AUTO)
        wait = under_group_tini() ? WAIT : NO_WAIT;
    pid1_note(cmd[0]);
    fa_env_set(&e, "FORGEALLOC_STATS", stats);
    fa_env_set(&e, "LD_PRELOAD", preload);
    fflush(stdout);
    if (wait == WAIT)
        run_waiting(path, cmd, &e, main_pid_ours);
    exec_command(path, cmd, e.v);
}
