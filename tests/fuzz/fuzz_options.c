/* fuzz_options.c - libFuzzer harness for the FORGEALLOC_* settings
 * (src/core/options.c).
 *
 * Input: byte 0 sets the capacity (0..64) of the small output buffers; the
 * rest is an environment block, entries separated by NUL or newline
 * ("FORGEALLOC_STATS=json\nJUNK=1\nFORGEALLOC_LOG=debug").
 *
 * Checks:
 *  - fa_option_parse of every entry's value (the text after the first '=',
 *    or the whole entry) for every row of fa_option_table: an accepted value
 *    obeys its row (range, enum index, 0/1, path length; a plain or K-unit
 *    rewrite of a size parses to the same bytes; the size form of SIZE_PCT
 *    agrees with SIZE); a refused one leaves *out untouched and says what
 *    was expected.
 *  - fa_options_load of the block returns the number of library settings
 *    whose first occurrence does not parse, and fa_opt() then holds, for
 *    every setting, that parse (environment), the default (invalid or
 *    absent; launcher settings are never loaded) and the matching source.
 *  - fa_option_format, fa_options_json and fa_options_echo into a small
 *    buffer keep the fa_buf contract (support.h); the whole fa_options_json
 *    document is valid JSON.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/core/options.h"
#include "support.h"

static char full_store[128 * 1024];

static void check_accepted(const fa_option_desc *d, const char *text, const fa_optval *v)
{
    FZ_CHECK(v->src == FA_SRC_ENV);
    switch (d->type) {
    case FA_TYPE_SIZE:
    case FA_TYPE_SIZE_POW2:
        FZ_CHECK(!v->is_pct);
        FZ_CHECK((d->min == 0 && d->max == 0) || ((double)v->u >= d->min && (double)v->u <= d->max));
        FZ_CHECK(d->type != FA_TYPE_SIZE_POW2 || (v->u & (v->u - 1)) == 0);
        if (v->u < 1000000000000000000ull) { /* 18 digits at most */
            char plain[32];
            fa_optval w;
            const char *expected;
            snprintf(plain, sizeof plain, "%llu", (unsigned long long)v->u);
            FZ_CHECK(fa_option_parse(d, plain, &w, &expected) && w.u == v->u);
            if (v->u % 1024 == 0) {
                snprintf(plain, sizeof plain, "%lluK", (unsigned long long)(v->u / 1024));
                FZ_CHECK(fa_option_parse(d, plain, &w, &expected) && w.u == v->u);
            }
        }
        break;
    case FA_TYPE_SIZE_PCT:
        if (v->is_pct) {
            FZ_CHECK(v->d >= d->min && v->d <= d->max && strchr(text, '%'));
        } else {
            fa_optval w;
            const char *expected;
            const fa_option_desc any_size = {"FORGEALLOC_ANY", FA_TYPE_SIZE, "0", 0, 0, NULL, FA_SCOPE_LIB, ""};
            FZ_CHECK(fa_option_parse(&any_size, text, &w, &expected));
            FZ_CHECK(w.u == v->u);
        }
        break;
    case FA_TYPE_NUM:
        FZ_CHECK(v->d >= d->min && v->d <= d->max && v->u == (uint64_t)v->d);
        break;
    case FA_TYPE_INT:
        FZ_CHECK(v->d >= d->min && v->d <= d->max && v->d == (double)v->u);
        break;
    case FA_TYPE_SECONDS:
        FZ_CHECK(v->u <= (uint64_t)(d->max * 1000.0));
        break;
    case FA_TYPE_BOOL:
        FZ_CHECK(v->u <= 1);
        break;
    case FA_TYPE_ENUM: {
        /* The index names the choice that the text spells, in any case. */
        const char *c = d->choices;
        for (uint64_t i = 0; i < v->u; i++) {
            c = strchr(c, '|');
            FZ_CHECK(c != NULL);
            c++;
        }
        size_t n = strcspn(c, "|");
        char word[32];
        FZ_CHECK(n < sizeof word);
        memcpy(word, c, n);
        word[n] = '\0';
        FZ_CHECK(fa_streq_nocase(text, word));
        break;
    }
    case FA_TYPE_PATH:
        FZ_CHECK(v->s == text && text[0] != '\0' && strlen(text) < 4096);
        break;
    }
}

static void check_parse(const char *text)
{
    for (int i = 0; i < FA_OPT_COUNT; i++) {
        const fa_option_desc *d = &fa_option_table[i];
        fa_optval v, untouched;
        memset(&v, 0xa5, sizeof v);
        memcpy(&untouched, &v, sizeof v);
        const char *expected = NULL;
        if (fa_option_parse(d, text, &v, &expected)) {
            check_accepted(d, text, &v);
        } else {
            FZ_CHECK(memcmp(&v, &untouched, sizeof v) == 0);
            FZ_CHECK(expected != NULL && expected[0] != '\0');
        }
    }
}

/* The entry of envp that sets `name` first, as fa_options_load finds it. */
static const char *first_value(char *const *envp, const char *name)
{
    size_t n = strlen(name);
    for (char *const *e = envp; *e; e++)
        if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
            return *e + n + 1;
    return NULL;
}

static bool same_value(const fa_optval *a, const fa_optval *b)
{
    return a->u == b->u && a->is_pct == b->is_pct && a->d == b->d;
}

static void check_load(char *const *envp)
{
    int bad = fz_options_load_quietly(envp);
    int expect_bad = 0;
    for (int i = 0; i < FA_OPT_COUNT; i++) {
        const fa_option_desc *d = &fa_option_table[i];
        const fa_optval *got = fa_opt((enum fa_opt_id)i);
        const char *text = d->scope == FA_SCOPE_LIB ? first_value(envp, d->name) : NULL;
        fa_optval parsed;
        const char *expected;
        if (text && fa_option_parse(d, text, &parsed, &expected)) {
            FZ_CHECK(got->src == FA_SRC_ENV);
            if (d->type == FA_TYPE_PATH)
                FZ_CHECK(got->s != text && strcmp(got->s, text) == 0);
            else
                FZ_CHECK(same_value(got, &parsed));
            continue;
        }
        if (text)
            expect_bad++;
        FZ_CHECK(got->src == (text ? FA_SRC_INVALID : FA_SRC_DEFAULT));
        if (d->type == FA_TYPE_PATH)
            FZ_CHECK(strcmp(got->s, d->def) == 0);
        else
            FZ_CHECK(fa_option_parse(d, d->def, &parsed, &expected) && same_value(got, &parsed));
    }
    FZ_CHECK(bad == expect_bad);
    FZ_CHECK(fa_options_invalid_count() == bad);
}

/* Run `render` into a buffer of `cap` bytes and into a large one. */
static void check_output(size_t cap, void (*render)(fa_buf *, int), int arg, bool json)
{
    char *small_store = malloc(cap);
    fa_buf small, full;
    fa_buf_init(&small, small_store, cap);
    fa_buf_init(&full, full_store, sizeof full_store);
    render(&small, arg);
    render(&full, arg);
    fz_check_truncation(&small, &full);
    if (json)
        FZ_CHECK(fz_json_valid(full.p, full.len));
    free(small_store);
}

static void render_format(fa_buf *b, int id) { fa_option_format(b, (enum fa_opt_id)id); }
static void render_json(fa_buf *b, int unused)
{
    (void)unused;
    fa_options_json(b);
}
static void render_echo(fa_buf *b, int unused)
{
    (void)unused;
    fa_options_echo(b);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_options_init();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    size_t cap = data[0] % 65;
    fz_env env;
    fz_env_make(&env, data + 1, size - 1);
    for (size_t i = 0; i < env.count; i++) {
        const char *eq = strchr(env.envp[i], '=');
        check_parse(eq ? eq + 1 : env.envp[i]);
    }
    check_load(env.envp);
    for (int i = 0; i < FA_OPT_COUNT; i++)
        check_output(cap, render_format, i, false);
    check_output(cap, render_json, 0, true);
    check_output(cap, render_echo, 0, false);
    fz_env_free(&env);
    return 0;
}
