/* p_lookup.c - what dlsym and dlvsym answer, with and without the shim.
 * Each mode checks facts that hold without any preload too, prints one line
 * per failed check and exits 1 if any failed, else prints "ok".
 *
 *   p_lookup libc NOLIBC_SO NAME@[@]VERSION...  through handles on libc
 *       (dlopen of "libc.so.6", of its full path, and of libm.so.6, whose
 *       dependencies reach libc): each of libc's malloc-family names (as
 *       nm -D lists them) is the definition the program's own reference
 *       binds to, with dlvsym at its version and with dlsym (where glibc
 *       has a default version); open, write and read stay glibc's; blocks
 *       made on one side are freed on the other; errno is kept; dlerror()
 *       reports a failed lookup (also of a malloc-family name, through
 *       NOLIBC_SO, a library with no dependencies) and nothing after a
 *       successful one.
 *   p_lookup next ORDER  with p_lookup_lib.so preloaded: RTLD_NEXT and
 *       RTLD_DEFAULT lookups, from the program and from that library, land
 *       where glibc's own dlsym and dlvsym called from there say; the
 *       library's wrappers reach the next definition.  ORDER: "alone" (no
 *       forgealloc), "lib-first" (LD_PRELOAD=lib:forgealloc),
 *       "forgealloc-first". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <gnu/libc-version.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failed;

#define CHECK(cond, ...)                                                                                         \
    do {                                                                                                         \
        if (!(cond)) {                                                                                           \
            failed = 1;                                                                                          \
            printf(__VA_ARGS__);                                                                                 \
            printf("\n");                                                                                        \
        }                                                                                                        \
    } while (0)

/* The file name of the object that defines f ("?" if none). */
static const char *object(const void *f)
{
    Dl_info info;
    if (!f || !dladdr(f, &info) || !info.dli_fname)
        return "?";
    const char *slash = strrchr(info.dli_fname, '/');
    return slash ? slash + 1 : info.dli_fname[0] ? info.dli_fname : "(program)";
}

/* The definition the program's own reference to name@version binds to:
 * the first in the global scope, which may be unversioned (a preloaded
 * library's); glibc's, where glibc has the name only at an old version. */
static void *program_binding(const char *name, const char *version)
{
    void *f = dlsym(RTLD_DEFAULT, name);
    return f ? f : dlvsym(RTLD_DEFAULT, name, version);
}

/* entry: "name@@VERSION" (the default version) or "name@VERSION", as nm -D
 * lists glibc's; names lists them all. */
static void through_handle(void *h, const char *how, const char *entry, char **names, int count)
{
    char name[128];
    const char *at = strchr(entry, '@');
    if (!at || (size_t)(at - entry) >= sizeof name) {
        CHECK(0, "bad entry %s", entry);
        return;
    }
    memcpy(name, entry, (size_t)(at - entry));
    name[at - entry] = '\0';
    int is_default = at[1] == '@';
    const char *version = at + 1 + is_default;
    void *want = program_binding(name, version);
    void *got = dlvsym(h, name, version);
    CHECK(got == want, "dlvsym(%s, %s, %s) = %p in %s; the program's binding is %p in %s", how, name, version, got,
          object(got), want, object(want));
    int has_default = 0;
    for (int i = 0; i < count; i++)
        has_default |= strncmp(names[i], name, strlen(name)) == 0 && strncmp(names[i] + strlen(name), "@@", 2) == 0;
    if (!is_default && has_default)
        return;
    /* Without a version: the default one; a name glibc has only at an old
     * version is not found (cfree), as without the shim. */
    want = is_default ? want : NULL;
    got = dlsym(h, name);
    CHECK(got == want, "dlsym(%s, %s) = %p in %s; expected %p in %s", how, name, got, object(got), want, object(want));
}

static int libc_handle(int argc, char **argv)
{
    const char *nolibc = argv[2];
    Dl_info self;
    CHECK(dladdr((void *)gnu_get_libc_version, &self) && self.dli_fname, "no path for libc");
    struct {
        const char *how;
        void *h;
    } handles[] = {
        {"libc.so.6", dlopen("libc.so.6", RTLD_NOW)},
        {self.dli_fname, dlopen(self.dli_fname, RTLD_NOW)},
        {"libm.so.6", dlopen("libm.so.6", RTLD_NOW)},
    };
    for (size_t i = 0; i < sizeof handles / sizeof handles[0]; i++) {
        CHECK(handles[i].h, "dlopen(%s): %s", handles[i].how, dlerror());
        for (int a = 3; a < argc && handles[i].h; a++)
            through_handle(handles[i].h, handles[i].how, argv[a], argv + 3, argc - 3);
    }
    void *libc = handles[0].h;
    if (!libc)
        return 1;

    /* Other names stay glibc's, wherever the program's calls go. */
    static const char *const others[] = {"open", "write", "read"};
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        void *f = dlsym(libc, others[i]);
        CHECK(strcmp(object(f), "libc.so.6") == 0, "dlsym(libc, %s) in %s, not glibc", others[i], object(f));
        f = dlvsym(libc, others[i], "GLIBC_2.2.5");
        CHECK(strcmp(object(f), "libc.so.6") == 0, "dlvsym(libc, %s) in %s, not glibc", others[i], object(f));
    }

    /* Blocks cross between the program's calls and the handle's. */
    void *(*libc_malloc)(size_t) = (void *(*)(size_t))dlsym(libc, "malloc");
    void (*libc_free)(void *) = (void (*)(void *))dlsym(libc, "free");
    char *(*libc_strdup)(const char *) = (char *(*)(const char *))dlsym(libc, "strdup");
    free(libc_malloc(1000));
    libc_free(malloc(1000));
    libc_free(libc_strdup("made by libc's strdup, freed through the handle"));
    libc_free(libc_malloc(3 << 20));

    /* errno as it was; dlerror as after glibc's own lookups. */
    errno = 4242;
    void *f = dlsym(libc, "malloc_trim");
    CHECK(f && errno == 4242, "errno %d after dlsym(libc, malloc_trim)", errno);
    errno = 4242;
    f = dlvsym(libc, "malloc_trim", "GLIBC_2.2.5");
    CHECK(f && errno == 4242, "errno %d after dlvsym(libc, malloc_trim)", errno);
    CHECK(!dlsym(libc, "p_lookup_no_such_function"), "a missing name found");
    const char *e = dlerror();
    CHECK(e && strstr(e, "p_lookup_no_such_function"), "dlerror after a failed lookup: %s", e ? e : "(null)");
    CHECK(!dlsym(libc, "p_lookup_no_such_function"), "a missing name found");
    CHECK(dlsym(libc, "malloc_trim") && !dlerror(), "dlerror after a successful lookup that followed a failed one");
    CHECK(!dlvsym(libc, "p_lookup_no_such_function", "GLIBC_2.2.5") && dlerror(), "dlvsym: no error reported");
    CHECK(!dlvsym(libc, "malloc_trim", "NO_SUCH_VERSION_1"), "malloc_trim at a version glibc lacks found");
    e = dlerror();
    CHECK(e && strstr(e, "malloc_trim"), "dlerror after dlvsym at a missing version: %s", e ? e : "(null)");
    void *bare = dlopen(nolibc, RTLD_NOW);
    CHECK(bare, "dlopen(%s): %s", nolibc, dlerror());
    if (bare) {
        CHECK(!dlsym(bare, "malloc"), "malloc found through a library that reaches no libc");
        e = dlerror();
        CHECK(e && strstr(e, "malloc"), "dlerror after a failed malloc lookup: %s", e ? e : "(null)");
        CHECK(!dlvsym(bare, "free", "GLIBC_2.2.5"), "free found through a library that reaches no libc");
        e = dlerror();
        CHECK(e && strstr(e, "free"), "dlerror after a failed free lookup: %s", e ? e : "(null)");
    }
    return failed;
}

/* Where a lookup made from the program or from p_lookup_lib lands. */
static void lands(const char *what, const void *f, const char *want)
{
    CHECK(strcmp(object(f), want) == 0, "%s: %p in %s, expected %s", what, f, object(f), want);
}

typedef void *(*sym_fn)(void *, const char *);
typedef void *(*vsym_fn)(void *, const char *, const char *);

static int next(const char *order)
{
    const char *lib = "libp_lookup_lib.so", *fa = "libforgealloc.so", *libc = "libc.so.6";
    int lib_first = strcmp(order, "lib-first") == 0, alone = strcmp(order, "alone") == 0;
    void (*lib_glibc)(sym_fn *, vsym_fn *) = (void (*)(sym_fn *, vsym_fn *))dlsym(RTLD_DEFAULT, "lookup_lib_glibc");
    void *(*lib_find)(void *, const char *, const char *, int) =
        (void *(*)(void *, const char *, const char *, int))dlsym(RTLD_DEFAULT, "lookup_lib_find");
    void *(*lib_libc)(const char *) = (void *(*)(const char *))dlsym(RTLD_DEFAULT, "lookup_lib_libc");
    int (*lib_calls)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "lookup_lib_calls");
    if (!lib_glibc || !lib_find || !lib_libc || !lib_calls) {
        printf("p_lookup_lib.so is not preloaded\n");
        return 1;
    }
    sym_fn glibc_sym;
    vsym_fn glibc_vsym;
    lib_glibc(&glibc_sym, &glibc_vsym);
    if (!glibc_sym || !glibc_vsym) {
        printf("glibc's dlsym not found\n");
        return 1;
    }

    /* Every lookup relative to its caller answers, from the program and
     * from the library, what glibc's own dlsym and dlvsym answer there. */
    static const char *const names[] = {"write", "malloc_trim", "open", "free", "_ZdlPv"};
    static const char *const versions[] = {NULL, "GLIBC_2.2.5", "GLIBCXX_3.4"};
    struct {
        void *h;
        const char *name;
    } handles[] = {{RTLD_NEXT, "RTLD_NEXT"}, {RTLD_DEFAULT, "RTLD_DEFAULT"}};
    for (size_t h = 0; h < 2; h++)
        for (size_t n = 0; n < sizeof names / sizeof names[0]; n++)
            for (size_t v = 0; v < sizeof versions / sizeof versions[0]; v++) {
                const char *name = names[n], *version = versions[v];
                void *got = version ? dlvsym(handles[h].h, name, version) : dlsym(handles[h].h, name);
                void *want = version ? glibc_vsym(handles[h].h, name, version) : glibc_sym(handles[h].h, name);
                CHECK(got == want, "from the program, %s %s@%s: %p in %s; glibc's answer %p in %s", handles[h].name,
                      name, version ? version : "", got, object(got), want, object(want));
                got = lib_find(handles[h].h, name, version, 0);
                want = lib_find(handles[h].h, name, version, 1);
                CHECK(got == want, "from the library, %s %s@%s: %p in %s; glibc's answer %p in %s",
                      handles[h].name, name, version ? version : "", got, object(got), want, object(want));
            }

    /* The same facts said plainly: who defines malloc_trim first, and next
     * after the library. */
    const char *first_trim = alone || lib_first ? lib : fa;
    lands("dlsym(RTLD_NEXT, malloc_trim) from the program", dlsym(RTLD_NEXT, "malloc_trim"), first_trim);
    lands("dlsym(RTLD_NEXT, malloc_trim) from the library", lib_find(RTLD_NEXT, "malloc_trim", NULL, 0),
          lib_first ? fa : libc);
    lands("dlvsym(RTLD_NEXT, write, GLIBC_2.2.5) from the program", dlvsym(RTLD_NEXT, "write", "GLIBC_2.2.5"), lib);
    lands("dlvsym(RTLD_NEXT, write, GLIBC_2.2.5) from the library",
          lib_find(RTLD_NEXT, "write", "GLIBC_2.2.5", 0), libc);
    lands("dlsym(RTLD_DEFAULT, malloc_trim)", dlsym(RTLD_DEFAULT, "malloc_trim"), first_trim);
    /* A wrapper that asks libc's handle for the function its own definition
     * stands in front of gets glibc's (not itself again). */
    lands("dlsym(libc, malloc_trim) from the library", lib_libc("malloc_trim"), alone || lib_first ? libc : fa);

    /* The wrappers work: write reaches glibc's, malloc_trim the next one. */
    int w = lib_calls("write");
    CHECK(write(1, "", 0) == 0 && lib_calls("write") == w + 1, "write did not go through the wrapper");
    int t = lib_calls("trim");
    malloc_trim(0);
    CHECK(lib_calls("trim") == t + (first_trim == lib), "malloc_trim went through the wrapper %d times",
          lib_calls("trim") - t);
    return failed;
}

int main(int argc, char **argv)
{
    int rc = 2;
    if (argc >= 3 && strcmp(argv[1], "libc") == 0)
        rc = libc_handle(argc, argv);
    else if (argc == 3 && strcmp(argv[1], "next") == 0)
        rc = next(argv[2]);
    else
        fprintf(stderr, "usage: p_lookup libc NOLIBC_SO NAME... | p_lookup next alone|lib-first|forgealloc-first\n");
    if (rc == 0)
        printf("ok\n");
    return rc;
}
