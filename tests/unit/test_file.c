/* test_file.c - stats files are complete or absent: atomic replace, no
 * temporary left behind, errors reported; a device, a FIFO or a link of
 * our own is appended to, a link somebody else made is never followed. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "testutil.h"
#include "../../src/stats/file.h"

static char dir[64];
static fa_file_scratch scratch; /* the writer's names and directory entries */

static int setup(void **state)
{
    (void)state;
    strcpy(dir, "/tmp/fa-file-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    return fa_remove_tree(dir);
}

static int entries(void)
{
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static void read_all(const char *path, char *out, size_t cap)
{
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    ssize_t n = read(fd, out, cap - 1);
    close(fd);
    out[n > 0 ? n : 0] = '\0';
}

static void test_expand(void **state)
{
    (void)state;
    char out[64];
    fa_path_parts p = {.pid = 123, .host = "c0ffee", .start_unix_ms = 1700000000123};
    assert_true(fa_path_expand("/x/s-%p.json", &p, out, sizeof out));
    assert_string_equal(out, "/x/s-123.json");
    p.pid = 7;
    assert_true(fa_path_expand("%p%%p%", &p, out, sizeof out));
    assert_string_equal(out, "7%p%");
    assert_false(fa_path_expand("/a/very/long/path/that/does/not/fit/%p", &p, out, 16));
    /* Parts that pids do not repeat across containers and restarts. */
    assert_true(fa_path_expand("/x/%h-%t-%p.txt", &p, out, sizeof out));
    assert_string_equal(out, "/x/c0ffee-1700000000123-7.txt");
    /* This process: the hostname as a file name part, never a '/'. */
    fa_path_parts here;
    fa_path_parts_here(&here, 9, 5);
    assert_true(here.host[0] != '\0' && strchr(here.host, '/') == NULL);
    assert_true(fa_path_expand("%t/%p", &here, out, sizeof out));
    assert_string_equal(out, "5/9");
}

static void test_write_replace(void **state)
{
    (void)state;
    char path[128], got[64];
    snprintf(path, sizeof path, "%s/stats.json", dir);
    assert_int_equal(fa_file_write_atomic(path, "first", 5, &scratch), 0);
    read_all(path, got, sizeof got);
    assert_string_equal(got, "first");
    strcpy(scratch.tmp, "x");
    assert_int_equal(fa_file_write_atomic(path, "second", 6, &scratch), 0);
    assert_string_equal(scratch.tmp, ""); /* cleared once renamed */
    read_all(path, got, sizeof got);
    assert_string_equal(got, "second");
    assert_int_equal(entries(), 1);
}

/* A file to keep and a link to it at dir/stats.json. */
static void precious_and_link(char *target, char *link, size_t cap)
{
    snprintf(target, cap, "%s/precious", dir);
    snprintf(link, cap, "%s/stats.json", dir);
    int fd = open(target, O_CREAT | O_WRONLY, 0600);
    assert_int_equal(write(fd, "keep", 4), 4);
    close(fd);
    assert_int_equal(symlink(target, link), 0);
}

/* A link somebody else made (planted in a shared directory) is replaced,
 * never written through.  Needs root to make a link of another user's. */
static void test_foreign_symlink_replaced(void **state)
{
    (void)state;
    if (geteuid() != 0)
        skip();
    char target[128], link[128], got[64];
    precious_and_link(target, link, sizeof target);
    assert_int_equal(lchown(link, 65534, 65534), 0);
    assert_int_equal(fa_file_write_atomic(link, "stats", 5, &scratch), 0);
    read_all(target, got, sizeof got);
    assert_string_equal(got, "keep");
    struct stat st;
    assert_int_equal(lstat(link, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    read_all(link, got, sizeof got);
    assert_string_equal(got, "stats");
}

/* A link of our own is followed and its target appended to, as a shell's
 * >> would (/dev/stderr leads to wherever stderr goes); it stays a link. */
static void test_own_symlink_appended(void **state)
{
    (void)state;
    char target[128], link[128], got[64];
    precious_and_link(target, link, sizeof target);
    assert_int_equal(fa_file_write_atomic(link, "stats", 5, &scratch), 0);
    read_all(target, got, sizeof got);
    assert_string_equal(got, "keepstats");
    struct stat st;
    assert_int_equal(lstat(link, &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    assert_int_equal(entries(), 2);
}

/* Somebody with write access to the directory swaps a link of theirs in
 * right after the writer looked at ours (the first lstat or fstat the
 * writer makes on the path): what the writer looked at is what it follows,
 * never the link swapped in.  Needs root to make a link of another
 * user's. */
static const char *swap_path, *swap_to;

static void swap_now(void)
{
    const char *path = swap_path;
    swap_path = NULL; /* once */
    char evil[160];
    snprintf(evil, sizeof evil, "%s/evil", dir);
    assert_int_equal(symlink(swap_to, evil), 0);
    assert_int_equal(lchown(evil, 65534, 65534), 0);
    assert_int_equal(rename(evil, path), 0);
}

int lstat(const char *path, struct stat *st)
{
    int r = fstatat(AT_FDCWD, path, st, AT_SYMLINK_NOFOLLOW);
    if (swap_path && strcmp(path, swap_path) == 0)
        swap_now();
    return r;
}

int fstat(int fd, struct stat *st)
{
    int r = fstatat(fd, "", st, AT_EMPTY_PATH);
    if (swap_path && r == 0 && S_ISLNK(st->st_mode))
        swap_now();
    return r;
}

static void test_link_swapped_after_check(void **state)
{
    (void)state;
    if (geteuid() != 0)
        skip();
    char target[128], link[128], precious[128], got[64];
    precious_and_link(target, link, sizeof target);
    snprintf(precious, sizeof precious, "%s/secret", dir);
    FILE *f = fopen(precious, "w");
    assert_non_null(f);
    fputs("secret", f);
    fclose(f);
    swap_path = link;
    swap_to = precious;
    fa_file_write_atomic(link, "stats", 5, &scratch);
    assert_null(swap_path); /* the swap happened */
    read_all(precious, got, sizeof got);
    assert_string_equal(got, "secret");
    read_all(target, got, sizeof got);
    assert_string_equal(got, "keepstats");
}

/* A FIFO stays a FIFO: with a reader it gets the data, without one the
 * write fails at once instead of waiting. */
static void test_fifo(void **state)
{
    (void)state;
    char path[128], got[64];
    snprintf(path, sizeof path, "%s/fifo", dir);
    assert_int_equal(mkfifo(path, 0600), 0);
    assert_int_equal(fa_file_write_atomic(path, "stats", 5, &scratch), ENXIO);
    int rd = open(path, O_RDONLY | O_NONBLOCK);
    assert_true(rd >= 0);
    assert_int_equal(fa_file_write_atomic(path, "stats", 5, &scratch), 0);
    ssize_t n = read(rd, got, sizeof got - 1);
    close(rd);
    assert_int_equal(n, 5);
    got[n] = '\0';
    assert_string_equal(got, "stats");
    struct stat st;
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISFIFO(st.st_mode));
    assert_int_equal(entries(), 1);
}

static void test_errors_leave_nothing(void **state)
{
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "%s/missing-dir/stats.json", dir);
    int before = entries();
    assert_int_equal(fa_file_write_atomic(path, "x", 1, &scratch), ENOENT);
    assert_string_equal(scratch.tmp, "");
    assert_int_equal(entries(), before);
    /* A directory where the file should go: the rename fails, the
     * temporary is removed. */
    snprintf(path, sizeof path, "%s/adir", dir);
    assert_int_equal(mkdir(path, 0700), 0);
    int err = fa_file_write_atomic(path, "x", 1, &scratch);
    assert_true(err == EISDIR || err == ENOTEMPTY || err == EEXIST);
    assert_int_equal(entries(), before + 1);
    char buf[32];
    assert_string_equal(fa_errno_text(EACCES, buf, sizeof buf), "permission denied");
    assert_string_equal(fa_errno_text(12345, buf, sizeof buf), "error 12345");
}

static void test_stale_temporaries_swept(void **state)
{
    (void)state;
    pid_t dead = fork();
    if (dead == 0)
        _exit(0);
    waitpid(dead, NULL, 0); /* a pid that no longer exists */
    char p[256], path[128], tag[17];
    assert_true(fa_file_ns_tag(tag));
    const char *names[7];
    char n0[64], n1[64], n4[64], n5[64], n6[64];
    snprintf(n0, sizeof n0, "old.json.tmp-%s-%d-3", tag, (int)dead);    /* stale, our namespace: removed */
    snprintf(n1, sizeof n1, "live.json.tmp-%s-%d-1", tag, (int)getppid()); /* its owner lives: kept */
    names[0] = n0;
    names[1] = n1;
    names[2] = "notes.tmp-abc";  /* not ours: kept */
    names[3] = "data.tmp-12-x";  /* not ours: kept */
    /* Another container's on a shared volume: its pid means nothing here,
     * so it may be mid-write: kept, with another tag or none. */
    snprintf(n4, sizeof n4, "other.json.tmp-%s-%d-1", strcmp(tag, "0123456789abcdef") ? "0123456789abcdef" : "fedcba9876543210",
             (int)dead);
    snprintf(n5, sizeof n5, "untagged.json.tmp-%d-1", (int)dead);
    snprintf(n6, sizeof n6, "noproc.json.tmp-untagged-%d-1", (int)dead);
    names[4] = n4;
    names[5] = n5;
    names[6] = n6;
    for (int i = 0; i < 7; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        close(open(p, O_CREAT | O_WRONLY, 0600));
    }
    snprintf(path, sizeof path, "%s/stats.json", dir);
    fa_file_sweep_stale(path, &scratch);
    snprintf(p, sizeof p, "%s/%s", dir, n0);
    assert_int_equal(access(p, F_OK), -1);
    for (int i = 1; i < 7; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        assert_int_equal(access(p, F_OK), 0);
    }
}

static void test_name_matches(void **state)
{
    (void)state;
    const char *t = "/var/log/fa/%h-%t-%p.txt";
    assert_true(fa_file_name_matches(t, "abc123-1795565106575-30722.txt"));
    assert_true(fa_file_name_matches(t, "my-host.lan-1795565106575-1.txt")); /* a hostname with '-' */
    assert_false(fa_file_name_matches(t, "host-1795565106575-1.json"));
    assert_false(fa_file_name_matches(t, "host-1795565106575-.txt"));
    assert_false(fa_file_name_matches(t, "host-1795565106575-12345678.txt")); /* no pid has 8 digits */
    assert_false(fa_file_name_matches(t, "report-2023-01.txt"));              /* %t has 13 digits */
    assert_false(fa_file_name_matches(t, "host-x795565106575-1.txt"));
    assert_false(fa_file_name_matches(t, "host-1795565106575-1.txt.tmp-0123456789abcdef-1-1")); /* a temporary */
    assert_false(fa_file_name_matches(t, "notes.txt"));
    assert_true(fa_file_name_matches("stats-%p", "stats-42"));
    assert_false(fa_file_name_matches("stats-%p", "stats-42.tmp-untagged-42-1"));
    assert_true(fa_file_name_matches("100%%-%p.json", "100%-7.json"));
    assert_false(fa_file_name_matches("100%%-%p.json", "100%%-7.json"));
    assert_true(fa_file_name_matches("fixed.json", "fixed.json"));
    assert_false(fa_file_name_matches("fixed.json", "fixed.jsonx"));
    /* A name that would take endless backtracking is no match, quickly. */
    char many[250];
    memset(many, '1', sizeof many - 1);
    many[sizeof many - 1] = '\0';
    assert_false(fa_file_name_matches("%h%h%h%h%h%h%hx", many));
}

/* A file in dir with the given age in seconds, beginning as a dump does
 * (or, with other, as something else). */
static void aged_as(const char *name, int age, const char *text)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    int fd = open(p, O_CREAT | O_WRONLY | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    struct timespec t[2];
    clock_gettime(CLOCK_REALTIME, &t[0]);
    t[0].tv_sec -= age;
    t[1] = t[0];
    assert_int_equal(utimensat(AT_FDCWD, p, t, AT_SYMLINK_NOFOLLOW), 0);
}

static void aged(const char *name, int age) { aged_as(name, age, "forgealloc 0.1.0: pid 1 (/bin/true), exit\n"); }

static bool present(const char *name)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat st;
    return lstat(p, &st) == 0;
}

static void test_prune(void **state)
{
    (void)state;
    char tmpl[128], own[128], name[64];
    snprintf(tmpl, sizeof tmpl, "%s/%%h-%%t-%%p.json", dir);
    snprintf(own, sizeof own, "%s/h-1700000000000-1.json", dir);
    aged("h-1700000000000-1.json", 5000); /* this process's own file: stays, however old */
    for (int i = 0; i < 15; i++) {        /* 100 to 240 seconds old, in JSON and Prometheus too */
        snprintf(name, sizeof name, "h-1700000000%03d-%d.json", 100 + i, 200 + i);
        aged_as(name, 100 + i * 10,
                i % 3 == 0   ? "forgealloc 0.1.0: pid 1\n"
                : i % 3 == 1 ? "{\"schema\":\"forgealloc.stats/1\",\"pid\":1}"
                             : "# HELP forgealloc_info forgealloc version\n");
    }
    aged("notes.json", 9000);                             /* not the pattern's */
    aged("h-1700000000002-2.json.tmp-untagged-2-1", 9000); /* a temporary */
    aged_as("x-1700000000004-4.json", 9000, "{\"mine\": true}"); /* the pattern's name, somebody else's file */
    char p[256];
    snprintf(p, sizeof p, "%s/h-1700000000003-3.json", dir);
    assert_int_equal(symlink("/nonexistent", p), 0); /* the pattern's name, not a regular file */

    fa_file_prune(tmpl, own, 0, &scratch); /* 0: keep all */
    assert_int_equal(entries(), 20);
    fa_file_prune(tmpl, own, 20, &scratch); /* 18 of the pattern: fewer than 20 */
    assert_int_equal(entries(), 20);
    /* 16 dumps (own included) > 10: down to 9, the oldest first: the 7
     * oldest of the 15.  The link and the other file neither count nor go. */
    fa_file_prune(tmpl, own, 10, &scratch);
    assert_int_equal(entries(), 13);
    for (int i = 0; i < 15; i++) {
        snprintf(name, sizeof name, "h-1700000000%03d-%d.json", 100 + i, 200 + i);
        assert_int_equal(present(name), i < 8);
    }
    assert_true(present("h-1700000000000-1.json") && present("notes.json") &&
                present("h-1700000000002-2.json.tmp-untagged-2-1") && present("h-1700000000003-3.json") &&
                present("x-1700000000004-4.json"));

    /* More than one round's worth (64) goes in one call. */
    for (int i = 0; i < 300; i++) {
        snprintf(name, sizeof name, "h-1700000001%03d-%d.json", i, 1000 + i);
        aged(name, 10 + i);
    }
    fa_file_prune(tmpl, own, 50, &scratch);
    /* 45 dumps (own among them); the link, the other file, notes, the temporary */
    assert_int_equal(entries(), 45 + 4);
    for (int i = 0; i < 300; i++) {
        snprintf(name, sizeof name, "h-1700000001%03d-%d.json", i, 1000 + i);
        assert_int_equal(present(name), i < 44);
    }
}

/* Files of somebody else's with the pattern's names take no dump's place:
 * with many of them, the dumps are still kept up to the limit. */
static void test_prune_lookalikes(void **state)
{
    (void)state;
    char tmpl[128], own[128], name[64];
    snprintf(tmpl, sizeof tmpl, "%s/%%p.json", dir);
    snprintf(own, sizeof own, "%s/1.json", dir);
    aged("1.json", 1);
    for (int i = 0; i < 40; i++) { /* another tool's files, older than every dump */
        snprintf(name, sizeof name, "%d.json", 100 + i);
        aged_as(name, 1000 + i, "{\"job\": 1}");
    }
    for (int i = 0; i < 8; i++) {
        snprintf(name, sizeof name, "%d.json", 500 + i);
        aged(name, 10 + i);
    }
    fa_file_prune(tmpl, own, 10, &scratch); /* 9 dumps: nothing goes */
    assert_int_equal(entries(), 49);
    for (int i = 0; i < 4; i++) {
        snprintf(name, sizeof name, "%d.json", 600 + i);
        aged(name, 100 + i);
    }
    fa_file_prune(tmpl, own, 10, &scratch); /* 13 dumps: down to 9, the 4 oldest go */
    assert_int_equal(entries(), 49);
    for (int i = 0; i < 4; i++) {
        snprintf(name, sizeof name, "%d.json", 600 + i);
        assert_false(present(name));
    }
    for (int i = 0; i < 40; i++) {
        snprintf(name, sizeof name, "%d.json", 100 + i);
        assert_true(present(name));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_expand),
        cmocka_unit_test_setup_teardown(test_write_replace, setup, teardown),
        cmocka_unit_test_setup_teardown(test_foreign_symlink_replaced, setup, teardown),
        cmocka_unit_test_setup_teardown(test_own_symlink_appended, setup, teardown),
        cmocka_unit_test_setup_teardown(test_link_swapped_after_check, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fifo, setup, teardown),
        cmocka_unit_test_setup_teardown(test_errors_leave_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stale_temporaries_swept, setup, teardown),
        cmocka_unit_test(test_name_matches),
        cmocka_unit_test_setup_teardown(test_prune, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prune_lookalikes, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
