/* test_parent.c - whether the parent process started as this one did:
 * an environment block read in pieces, and the parent's library. */
#define _GNU_SOURCE
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "parent.h"

extern char **environ;

/* fa_env_block_alike over `block` (len bytes, NULs included) against envp. */
static bool alike(const char *block, size_t len, char *const *envp, const char *const *names, size_t n)
{
    int fd = memfd_create("block", MFD_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, block, len), (ssize_t)len);
    assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
    errno = 1234;
    bool r = fa_env_block_alike(fd, envp, names, n);
    assert_int_equal(errno, 1234);
    close(fd);
    return r;
}

#define BLOCK(s) s, sizeof s - 1 /* a literal with its inner NULs, without the last */

static void test_block(void **state)
{
    (void)state;
    const char *const delay[] = {"FORGEALLOC_RELEASE_DELAY"};
    char *none[] = {NULL};
    char *bad[] = {"HOME=/h", "FORGEALLOC_RELEASE_DELAY=5sec", NULL};
    /* Absent from both, present in both alike. */
    assert_true(alike(BLOCK("HOME=/x\0PATH=/bin\0"), none, delay, 1));
    assert_true(alike(BLOCK("A=1\0FORGEALLOC_RELEASE_DELAY=5sec\0B=2\0"), bad, delay, 1));
    assert_true(alike(BLOCK(""), none, delay, 1));
    /* In one only, or another value: a value that is the other's start, or longer. */
    assert_false(alike(BLOCK("A=1\0"), bad, delay, 1));
    assert_false(alike(BLOCK("FORGEALLOC_RELEASE_DELAY=5sec\0"), none, delay, 1));
    assert_false(alike(BLOCK("FORGEALLOC_RELEASE_DELAY=7sec\0"), bad, delay, 1));
    assert_false(alike(BLOCK("FORGEALLOC_RELEASE_DELAY=5se\0"), bad, delay, 1));
    assert_false(alike(BLOCK("FORGEALLOC_RELEASE_DELAY=5secs\0"), bad, delay, 1));
    assert_false(alike(BLOCK("FORGEALLOC_RELEASE_DELAY=\0"), bad, delay, 1));
    /* The first entry of a name counts, as for the loader and getenv. */
    assert_true(alike(BLOCK("FORGEALLOC_RELEASE_DELAY=5sec\0FORGEALLOC_RELEASE_DELAY=1\0"), bad, delay, 1));
    assert_false(alike(BLOCK("FORGEALLOC_RELEASE_DELAY=1\0FORGEALLOC_RELEASE_DELAY=5sec\0"), bad, delay, 1));
    /* A longer name, a name without '=', one that ends the block without its NUL. */
    assert_true(alike(BLOCK("FORGEALLOC_RELEASE_DELAYS=5sec\0FORGEALLOC_RELEASE_DELAY\0"), none, delay, 1));
    assert_true(alike(BLOCK("X=1\0FORGEALLOC_RELEASE_DELAY=5sec"), bad, delay, 1));
    assert_false(alike(BLOCK("X=1\0FORGEALLOC_RELEASE_DELAY=5se"), bad, delay, 1));
    /* FORGEALLOC_LOG is always compared: a parent told to print no warning. */
    char *warn[] = {"FORGEALLOC_RELEASE_DELAY=5sec", "FORGEALLOC_LOG=warn", NULL};
    assert_false(alike(BLOCK("FORGEALLOC_LOG=error\0FORGEALLOC_RELEASE_DELAY=5sec\0"), bad, delay, 1));
    assert_false(alike(BLOCK("FORGEALLOC_LOG=error\0FORGEALLOC_RELEASE_DELAY=5sec\0"), warn, delay, 1));
    assert_true(alike(BLOCK("FORGEALLOC_LOG=warn\0FORGEALLOC_RELEASE_DELAY=5sec\0"), warn, delay, 1));
    /* A name may be an environment entry: it ends at '='. */
    const char *entry[] = {"FORGEALLOC_BOGUS=whatever"};
    char *bogus[] = {"FORGEALLOC_BOGUS=1", NULL};
    assert_true(alike(BLOCK("FORGEALLOC_BOGUS=1\0"), bogus, entry, 1));
    assert_false(alike(BLOCK("FORGEALLOC_BOGUS=2\0"), bogus, entry, 1));
    assert_false(alike(BLOCK("FORGEALLOC_BOGU=1\0"), bogus, entry, 1));
    /* Several names: all alike. */
    const char *two[] = {"LD_PRELOAD", "FORGEALLOC_RELEASE_DELAY"};
    char *both[] = {"LD_PRELOAD=a b", "FORGEALLOC_RELEASE_DELAY=5sec", NULL};
    assert_true(alike(BLOCK("FORGEALLOC_RELEASE_DELAY=5sec\0LD_PRELOAD=a b\0"), both, two, 2));
    assert_false(alike(BLOCK("FORGEALLOC_RELEASE_DELAY=5sec\0LD_PRELOAD=a:b\0"), both, two, 2));
    /* Too many names to tell: not alike. */
    const char *many[9] = {"A", "B", "C", "D", "E", "F", "G", "H", "I"};
    assert_false(alike(BLOCK(""), none, many, 9));
}

/* Values longer than the reader's buffer, equal or differing at their end. */
static void test_block_long(void **state)
{
    (void)state;
    size_t vlen = 5000;
    char *own = malloc(vlen + 32), *block = malloc(2 * vlen + 64);
    assert_non_null(own);
    assert_non_null(block);
    strcpy(own, "LD_PRELOAD=");
    memset(own + 11, 'x', vlen);
    own[11 + vlen] = '\0';
    char *envp[] = {own, NULL};
    const char *names[] = {"LD_PRELOAD"};
    /* An entry as long before it, then ours. */
    memset(block, 'y', vlen);
    memcpy(block, "FILLER=", 7);
    block[vlen] = '\0';
    size_t len = vlen + 1;
    memcpy(block + len, own, strlen(own) + 1);
    len += strlen(own) + 1;
    assert_true(alike(block, len, envp, names, 1));
    block[len - 2] = 'z';
    assert_false(alike(block, len, envp, names, 1));
    block[len - 2] = '\0'; /* one byte short */
    assert_false(alike(block, len - 1, envp, names, 1));
    free(own);
    free(block);
}

static void test_read_fails(void **state)
{
    (void)state;
    const char *names[] = {"HOME"};
    char *none[] = {NULL};
    errno = 1234;
    assert_false(fa_env_block_alike(-1, none, names, 1));
    assert_int_equal(errno, 1234);
}

/* The test's own parent (ctest, a shell) has no copy of this program
 * mapped (and a name absent from every environment here makes the
 * environments alike, unless FORGEALLOC_LOG differs); a forked child's
 * parent is this process, started with environ. */
static void test_parent(void **state)
{
    (void)state;
    const char *names[] = {"FA_TEST_NO_SUCH_NAME"};
    char *none[] = {NULL};
    errno = 1234;
    assert_false(fa_parent_started_alike(none, names, 1));
    assert_int_equal(errno, 1234);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char *other[] = {"FA_TEST_NO_SUCH_NAME=1", NULL};
        char *log[] = {"FORGEALLOC_LOG=not-a-level", NULL};
        errno = 77;
        bool same = fa_parent_started_alike(environ, names, 1);
        bool differs = !fa_parent_started_alike(other, names, 1) && !fa_parent_started_alike(log, names, 1);
        _exit(same && differs && errno == 77 ? 0 : 1);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block),
        cmocka_unit_test(test_block_long),
        cmocka_unit_test(test_read_fails),
        cmocka_unit_test(test_parent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
