/* test_dynsym.c - a definition read from a loaded library's dynamic symbol
 * table (dynsym.c) is the one dlsym finds there: through GNU and SysV hash
 * tables, at the default version, never at a hidden one, never an indirect
 * function; and glibc's dlsym found in libc (or libdl). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "../../src/host/dynsym.h"

static void check_library(const char *path)
{
    void *h = dlopen(path, RTLD_NOW);
    assert_non_null(h);
    struct dl_phdr_info obj;
    assert_true(fa_dynsym_object(strrchr(path, '/') + 1, &obj));
    assert_string_equal(obj.dlpi_name, path);

    assert_ptr_equal(fa_dynsym_lookup(&obj, "dynsym_plain"), dlsym(h, "dynsym_plain"));
    assert_ptr_equal(fa_dynsym_lookup(&obj, "dynsym_data"), dlsym(h, "dynsym_data"));
    /* The default version, as an unversioned reference binds. */
    void *v2 = dlvsym(h, "dynsym_versioned", "DYNSYM_2"), *v1 = dlvsym(h, "dynsym_versioned", "DYNSYM_1");
    assert_non_null(v1);
    assert_true(v1 != v2);
    assert_ptr_equal(fa_dynsym_lookup(&obj, "dynsym_versioned"), v2);
    assert_ptr_equal(dlsym(h, "dynsym_versioned"), v2);
    /* Only at a hidden version: dlsym does not find it either. */
    assert_non_null(dlvsym(h, "dynsym_old", "DYNSYM_1"));
    assert_null(dlsym(h, "dynsym_old"));
    assert_null(fa_dynsym_lookup(&obj, "dynsym_old"));
    /* Its resolver is not run. */
    assert_non_null(dlsym(h, "dynsym_ifunc"));
    assert_null(fa_dynsym_lookup(&obj, "dynsym_ifunc"));
    /* Local, or not there at all. */
    assert_null(fa_dynsym_lookup(&obj, "dynsym_local"));
    assert_null(fa_dynsym_lookup(&obj, "dynsym_missing"));
    assert_null(fa_dynsym_lookup(&obj, ""));
    dlclose(h);
}

static void test_gnu_hash(void **state)
{
    (void)state;
    check_library(DYNSYM_GNU);
}

static void test_sysv_hash(void **state)
{
    (void)state;
    check_library(DYNSYM_SYSV);
}

/* glibc's dlsym (libc.so.6 since 2.34, libdl.so.2 before), as this
 * process binds it (no preload in unit tests). */
static void test_glibc_dlsym(void **state)
{
    (void)state;
    struct dl_phdr_info libc, dl;
    assert_true(fa_dynsym_object("libc.so.6", &libc));
    void *found = fa_dynsym_lookup(&libc, "dlsym");
    if (!found && fa_dynsym_object("libdl.so.2", &dl))
        found = fa_dynsym_lookup(&dl, "dlsym");
    assert_non_null(found);
    /* Asked of libc's own handle: a sanitizer's runtime defines both names
     * ahead of libc, so the global scope finds its functions instead. */
    void *libc_h = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
    assert_non_null(libc_h);
    void *want = dlsym(libc_h, "dlsym");
    if (!want) { /* glibc before 2.34: dlsym lives in libdl */
        void *dl_h = dlopen("libdl.so.2", RTLD_LAZY | RTLD_NOLOAD);
        assert_non_null(dl_h);
        want = dlsym(dl_h, "dlsym");
        dlclose(dl_h);
    }
    assert_ptr_equal(found, want);
    assert_ptr_equal(fa_dynsym_lookup(&libc, "malloc"), dlsym(libc_h, "malloc"));
    dlclose(libc_h);
    assert_false(fa_dynsym_object("libfa-no-such-library.so.9", &dl));
    assert_false(fa_dynsym_object("c.so.6", &dl)); /* the whole file name, not its end */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gnu_hash),
        cmocka_unit_test(test_sysv_hash),
        cmocka_unit_test(test_glibc_dlsym),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
