/* test_options.c - every FORGEALLOC_* option with good, bad, out-of-range
 * and suffixed values, and the one-line messages for bad ones. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <pthread.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "options.h"
#include "testutil.h"

static fa_optval parse_ok(enum fa_opt_id id, const char *text)
{
    fa_optval v;
    const char *expected = NULL;
    if (!fa_option_parse(&fa_option_table[id], text, &v, &expected))
        fail_msg("%s='%s' should parse", fa_option_table[id].name, text);
    return v;
}

static void parse_bad(enum fa_opt_id id, const char *text)
{
    fa_optval v;
    const char *expected = NULL;
    if (fa_option_parse(&fa_option_table[id], text, &v, &expected))
        fail_msg("%s='%s' should be rejected", fa_option_table[id].name, text);
    assert_non_null(expected);
}

static void test_sizes(void **state)
{
    (void)state;
    const struct {
        const char *text;
        uint64_t bytes;
    } good[] = {
        {"0", 0},
        {"1", 1},
        {"4096", 4096},
        {"1K", 1024},
        {"1k", 1024},
        {"1KB", 1024},
        {"1KiB", 1024},
        {"1kib", 1024},
        {"64M", 64ull << 20},
        {"64MiB", 64ull << 20},
        {"1G", 1ull << 30},
        {"1gb", 1ull << 30},
        {"2T", 2ull << 40},
        {"1.5G", 3ull << 29},
        {"0.5K", 512},
        {"100b", 100},
        {" 8M ", 8ull << 20},
        {"16 MiB", 16ull << 20},
        {"16777215T", 16777215ull << 40}, /* the largest whole number of TiB below 2^64 */
        {"1.500000000000G", 3ull << 29},  /* zeros past the 9th decimal */
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        fa_optval v;
        const char *expected = NULL;
        const fa_option_desc any = {"FORGEALLOC_ANY", FA_TYPE_SIZE, "0", 0, 0, NULL, FA_SCOPE_LIB, ""};
        if (!fa_option_parse(&any, good[i].text, &v, &expected))
            fail_msg("'%s' should parse as a size", good[i].text);
        if (v.u != good[i].bytes)
            fail_msg("'%s' parsed as %llu, expected %llu", good[i].text, (unsigned long long)v.u,
                     (unsigned long long)good[i].bytes);
    }
    const char *bad[] = {"",      "abc", "12X",  "-1",  "1e9",  "1.5",       "K",        "1KK",   "1 apples",
                         "1..5M", ".",   "0x10", "1MiBs", "99999999999999999999", "16777216T" /* 2^64 */, "1iB", "1 G B",
                         "1.0000000001G" /* a 10th decimal: it was dropped */};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        parse_bad(FA_OPT_LARGE_ALLOC_REPORT, bad[i]);
}

static void test_size_or_percent(void **state)
{
    (void)state;
    fa_optval v = parse_ok(FA_OPT_DEVICE_POOL_SIZE, "40%");
    assert_true(v.is_pct);
    assert_true(v.d == 40.0);
    v = parse_ok(FA_OPT_DEVICE_POOL_SIZE, "12.5%");
    assert_true(v.is_pct && v.d == 12.5);
    v = parse_ok(FA_OPT_DEVICE_POOL_SIZE, "0");
    assert_false(v.is_pct);
    assert_int_equal(v.u, 0);
    v = parse_ok(FA_OPT_DEVICE_POOL_SIZE, "2G");
    assert_false(v.is_pct);
    assert_int_equal(v.u, 2ull << 30);
    v = parse_ok(FA_OPT_DEVICE_POOL_SIZE, "100%");
    assert_true(v.is_pct && v.d == 100.0);
    const char *bad[] = {"101%", "-5%", "%", "40%%", "abc%", "12X", "1e2%"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        parse_bad(FA_OPT_DEVICE_POOL_SIZE, bad[i]);
}

static void test_numbers(void **state)
{
    (void)state;
    assert_true(parse_ok(FA_OPT_RELEASE_RATE, "0").d == 0.0);
    assert_true(parse_ok(FA_OPT_RELEASE_RATE, "10").d == 10.0);
    assert_true(parse_ok(FA_OPT_RELEASE_RATE, "2.5").d == 2.5);
    assert_true(parse_ok(FA_OPT_RELEASE_RATE, " 3 ").d == 3.0);
    assert_true(parse_ok(FA_OPT_RELEASE_RATE, "2.5000000000").d == 2.5);
    const char *bad[] = {"11", "-1", "10.5", "abc", "", "1e1", "5x", "nan", "inf", "2.0000000001"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        parse_bad(FA_OPT_RELEASE_RATE, bad[i]);
}

static void test_seconds(void **state)
{
    (void)state;
    assert_int_equal(parse_ok(FA_OPT_STATS_INTERVAL, "30").u, 30000);
    assert_int_equal(parse_ok(FA_OPT_STATS_INTERVAL, "1.5s").u, 1500);
    assert_int_equal(parse_ok(FA_OPT_STATS_INTERVAL, "500ms").u, 500);
    assert_int_equal(parse_ok(FA_OPT_STATS_INTERVAL, "2m").u, 120000);
    assert_int_equal(parse_ok(FA_OPT_STATS_INTERVAL, "0").u, 0);
    assert_int_equal(parse_ok(FA_OPT_STATS_INTERVAL, "0ms").u, 0);
    assert_int_equal(parse_ok(FA_OPT_STATS_INTERVAL, "0.5ms").u, 1);
    assert_int_equal(parse_ok(FA_OPT_STATS_INTERVAL, "0.001").u, 1);
    assert_int_equal(parse_ok(FA_OPT_RELEASE_DELAY, "1.5000000000s").u, 1500);
    /* Not 0, yet below 1 ms: it would round to 0, which is another mode
     * (only at exit, at once).  More than 9 decimals are not kept. */
    const char *bad[] = {"-1", "1h", "86401", "2000m", "abc", "", "5 sec", "0.4ms", "0.0004", "0.0001s",
                         "1.0000000001", "0.0000000001"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        parse_bad(FA_OPT_STATS_INTERVAL, bad[i]);
    parse_bad(FA_OPT_RELEASE_DELAY, "0.4ms");

    char out[2048];
    char *env[] = {"FORGEALLOC_RELEASE_DELAY=0.4ms", "FORGEALLOC_STATS_INTERVAL=0.0004",
                   "FORGEALLOC_RELEASE_RATE=2.0000000001", NULL};
    fa_capture_stderr_begin();
    assert_int_equal(fa_options_load(env), 3);
    fa_capture_stderr_end(out, sizeof out);
    assert_int_equal(fa_count_lines(out), 3);
    assert_non_null(strstr(out, "forgealloc: FORGEALLOC_RELEASE_DELAY='0.4ms' is not 0 or a duration of at least 1 ms "
                                "(a shorter one would round to 0, which has its own meaning); using 2s\n"));
    assert_non_null(strstr(out, "forgealloc: FORGEALLOC_STATS_INTERVAL='0.0004' is not 0 or a duration of at least "
                                "1 ms (a shorter one would round to 0, which has its own meaning); using 0s\n"));
    assert_non_null(strstr(out, "forgealloc: FORGEALLOC_RELEASE_RATE='2.0000000001' is not a value with at most 9 "
                                "decimals; using 0\n"));
    assert_int_equal(fa_opt_u64(FA_OPT_RELEASE_DELAY), 2000);
    char *none[] = {NULL};
    fa_options_load(none);
}

static void test_bool_enum_path(void **state)
{
    (void)state;
    const char *yes[] = {"1", "true", "TRUE", "yes", "on", "On"};
    const char *no[] = {"0", "false", "no", "off", "OFF"};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++)
        assert_int_equal(parse_ok(FA_OPT_STATS_ON_SIGNAL, yes[i]).u, 1);
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        assert_int_equal(parse_ok(FA_OPT_STATS_ON_SIGNAL, no[i]).u, 0);
    parse_bad(FA_OPT_STRICT, "2");
    parse_bad(FA_OPT_STRICT, "maybe");
    parse_bad(FA_OPT_STRICT, "");
    parse_bad(FA_OPT_STRICT, "  ");
    /* Blanks around a boolean or a choice are skipped, as around a size. */
    assert_int_equal(parse_ok(FA_OPT_STATS_ON_SIGNAL, " 0 ").u, 0);
    assert_int_equal(parse_ok(FA_OPT_STATS_ON_SIGNAL, "\tyes").u, 1);
    assert_int_equal(parse_ok(FA_OPT_STATS, "json ").u, FA_STATS_JSON);
    assert_int_equal(parse_ok(FA_OPT_LOG, " \tinfo\t ").u, FA_LOG_INFO);
    parse_bad(FA_OPT_STATS, "js on");

    assert_int_equal(parse_ok(FA_OPT_STATS, "off").u, FA_STATS_OFF);
    assert_int_equal(parse_ok(FA_OPT_STATS, "text").u, FA_STATS_TEXT);
    assert_int_equal(parse_ok(FA_OPT_STATS, "JSON").u, FA_STATS_JSON);
    assert_int_equal(parse_ok(FA_OPT_STATS, "prometheus").u, FA_STATS_PROMETHEUS);
    parse_bad(FA_OPT_STATS, "xml");
    parse_bad(FA_OPT_STATS, "jso");
    parse_bad(FA_OPT_STATS, "jsonx");
    parse_bad(FA_OPT_STATS, "");
    assert_int_equal(parse_ok(FA_OPT_LOG, "debug").u, FA_LOG_DEBUG);
    parse_bad(FA_OPT_LOG, "verbose");

    assert_string_equal(parse_ok(FA_OPT_STATS_FILE, "/tmp/x-%p.json").s, "/tmp/x-%p.json");
    assert_string_equal(parse_ok(FA_OPT_STATS_FILE, "-").s, "-");
    assert_string_equal(parse_ok(FA_OPT_STATS_FILE, " s.json ").s, " s.json "); /* a path is taken as it is */
    parse_bad(FA_OPT_STATS_FILE, "");
}

static void test_defaults_parse(void **state)
{
    (void)state;
    /* Every default in the table is itself a valid value of its type. */
    for (int i = 0; i < FA_OPT_COUNT; i++) {
        const fa_option_desc *d = &fa_option_table[i];
        if (d->type == FA_TYPE_PATH && d->def[0] == '\0')
            continue; /* launcher paths with no default */
        fa_optval v;
        const char *expected;
        if (!fa_option_parse(d, d->def, &v, &expected))
            fail_msg("default of %s ('%s') does not parse", d->name, d->def);
        assert_non_null(d->doc);
        assert_true(strncmp(d->name, "FORGEALLOC_", 11) == 0);
    }
}

static void test_load_and_messages(void **state)
{
    (void)state;
    char out[4096];
    char *env_good[] = {"PATH=/bin", "FORGEALLOC_STATS=json", "FORGEALLOC_RELEASE_THRESHOLD=32M",
                        "FORGEALLOC_DEVICE_POOL_SIZE=25%", "FORGEALLOC_LOG=info", NULL};
    fa_capture_stderr_begin();
    assert_int_equal(fa_options_load(env_good), 0);
    fa_capture_stderr_end(out, sizeof out);
    assert_string_equal(out, "");
    assert_int_equal(fa_opt_u64(FA_OPT_STATS), FA_STATS_JSON);
    assert_int_equal(fa_opt_u64(FA_OPT_RELEASE_THRESHOLD), 32ull << 20);
    assert_true(fa_opt(FA_OPT_DEVICE_POOL_SIZE)->is_pct);
    assert_int_equal(fa_opt(FA_OPT_STATS)->src, FA_SRC_ENV);
    assert_int_equal(fa_opt(FA_OPT_RELEASE_RATE)->src, FA_SRC_DEFAULT);
    assert_true(fa_opt(FA_OPT_RELEASE_RATE)->d == 0.0);

    /* Three bad values: three lines, each naming its variable, the
     * expectation and the default used; defaults kept. */
    char *env_bad[] = {"FORGEALLOC_RELEASE_RATE=abc", "FORGEALLOC_DEVICE_POOL_SIZE=12X",
                       "FORGEALLOC_STATS=xml\x01\xff", "FORGEALLOC_STATZ=1", "FORGEALLOC_STATS_MAIN_PID=1.5",
                       "FORGEALLOC_RELEASE_DELAY=2h", NULL};
    fa_capture_stderr_begin();
    assert_int_equal(fa_options_load(env_bad), 5);
    fa_capture_stderr_end(out, sizeof out);
    assert_int_equal(fa_count_lines(out), 6);
    assert_non_null(strstr(out, "forgealloc: FORGEALLOC_RELEASE_RATE='abc' is not a number from 0 to 10; using 0\n"));
    assert_non_null(strstr(out, "forgealloc: FORGEALLOC_DEVICE_POOL_SIZE='12X' is not a size or a percentage from 0% "
                                "to 100% (use 4G, 512MiB or 40%); using 1.00 GiB\n"));
    /* A whole number takes no fraction (it is not cut to one). */
    assert_non_null(strstr(out, "forgealloc: FORGEALLOC_STATS_MAIN_PID='1.5' is not a whole number from 0 to 4194304; "
                                "using 0\n"));
    assert_int_equal(fa_opt_u64(FA_OPT_STATS_MAIN_PID), 0);
    assert_non_null(strstr(out, "forgealloc: FORGEALLOC_RELEASE_DELAY='2h' is not a duration from 0 to 3600 seconds "
                                "(use 30, 1.5s, 500ms or 2m); using 2s\n"));
    assert_non_null(strstr(out, "forgealloc: FORGEALLOC_STATS='xml\\x01\\xff' is not one of off, text, json, "
                                "prometheus; using off\n"));
    assert_non_null(strstr(out, "forgealloc: FORGEALLOC_STATZ is not a forgealloc setting and is ignored; "));
    assert_int_equal(fa_options_unknown_count(), 1); /* FORGEALLOC_STRICT refuses it too */
    assert_true(fa_opt(FA_OPT_RELEASE_RATE)->d == 0.0);
    assert_int_equal(fa_opt(FA_OPT_RELEASE_RATE)->src, FA_SRC_INVALID);
    assert_int_equal(fa_opt_u64(FA_OPT_STATS), FA_STATS_OFF);

    /* FORGEALLOC_LOG=error hides the warnings but still counts them. */
    char *env_quiet[] = {"FORGEALLOC_LOG=error", "FORGEALLOC_STATS=bogus", NULL};
    fa_capture_stderr_begin();
    assert_int_equal(fa_options_load(env_quiet), 1);
    fa_capture_stderr_end(out, sizeof out);
    assert_string_equal(out, "");

    /* An empty value says so. */
    char *env_empty[] = {"FORGEALLOC_STATS_FILE=", NULL};
    fa_capture_stderr_begin();
    assert_int_equal(fa_options_load(env_empty), 1);
    fa_capture_stderr_end(out, sizeof out);
    assert_non_null(strstr(out, "FORGEALLOC_STATS_FILE='' is empty; expected a path (or - for stderr); using -\n"));

    /* A very long value is cut in the message, which stays one line. */
    char longval[3000] = "FORGEALLOC_RELEASE_RATE=";
    memset(longval + strlen(longval), '7', 2000);
    char *env_long[] = {longval, NULL};
    fa_capture_stderr_begin();
    assert_int_equal(fa_options_load(env_long), 1);
    fa_capture_stderr_end(out, sizeof out);
    assert_int_equal(fa_count_lines(out), 1);
    assert_true(strlen(out) < 400);
    assert_non_null(strstr(out, "...' is not a number"));

    /* Under FORGEALLOC_STRICT=1 a misspelt name is an error, not ignored. */
    char *env_strict[] = {"FORGEALLOC_STRICT=1", "FORGEALLOC_LOG=error", "FORGEALLOC_STAT=json", NULL};
    fa_capture_stderr_begin();
    assert_int_equal(fa_options_load(env_strict), 0);
    fa_capture_stderr_end(out, sizeof out);
    assert_int_equal(fa_options_unknown_count(), 1);
    assert_string_equal(out, "forgealloc: FORGEALLOC_STAT is not a forgealloc setting; `forgealloc env` lists them "
                             "all\n");

    char *env_none[] = {NULL};
    assert_int_equal(fa_options_load(env_none), 0);
    assert_int_equal(fa_options_unknown_count(), 0);
}

static void test_rendering(void **state)
{
    (void)state;
    char *env[] = {"FORGEALLOC_DEVICE_POOL_SIZE=12.5%", "FORGEALLOC_STATS_INTERVAL=1.5s", NULL};
    fa_options_load(env);
    char out[16384];
    fa_buf b;
    fa_buf_init(&b, out, sizeof out);
    fa_option_format(&b, FA_OPT_DEVICE_POOL_SIZE);
    assert_string_equal(out, "12.5%");
    fa_buf_init(&b, out, sizeof out);
    fa_option_format(&b, FA_OPT_STATS_INTERVAL);
    assert_string_equal(out, "1.500s");
    fa_buf_init(&b, out, sizeof out);
    fa_option_format(&b, FA_OPT_RELEASE_THRESHOLD);
    assert_string_equal(out, "32.0 MiB");

    fa_buf_init(&b, out, sizeof out);
    fa_options_json(&b);
    assert_false(fa_buf_overflowed(&b));
    assert_true(fa_json_valid(out));
    for (int i = 0; i < FA_OPT_COUNT; i++)
        assert_non_null(strstr(out, fa_option_table[i].name));

    fa_buf_init(&b, out, sizeof out);
    fa_options_echo(&b);
    assert_non_null(strstr(out, "DEVICE_POOL_SIZE=12.5%"));
    assert_null(strchr(out, '\n'));
    char *none[] = {NULL};
    fa_options_load(none);
}

/* Until the first load has filled the values, another thread asking for
 * a setting gets the table's defaults, never zeros (STATS off would be
 * harmless, RELEASE_THRESHOLD 0 means "return everything").  Each child
 * process starts unloaded and races two threads to the first load. */
static int go;
static uint64_t seen_threshold, seen_report;

static void *race_reader(void *arg)
{
    (void)arg;
    while (!__atomic_load_n(&go, __ATOMIC_ACQUIRE))
        ;
    seen_threshold = fa_opt_u64(FA_OPT_RELEASE_THRESHOLD);
    seen_report = fa_opt_u64(FA_OPT_LARGE_ALLOC_REPORT);
    return NULL;
}

static void test_concurrent_first_load(void **state)
{
    (void)state;
    int zeros = 0;
    /* The table's defaults, parsed here without loading. */
    uint64_t want_threshold = parse_ok(FA_OPT_RELEASE_THRESHOLD, fa_option_table[FA_OPT_RELEASE_THRESHOLD].def).u;
    uint64_t want_report = parse_ok(FA_OPT_LARGE_ALLOC_REPORT, fa_option_table[FA_OPT_LARGE_ALLOC_REPORT].def).u;
    assert_true(want_threshold != 0 && want_report != 0);
    for (int i = 0; i < 400; i++) {
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            pthread_t t;
            pthread_create(&t, NULL, race_reader, NULL);
            __atomic_store_n(&go, 1, __ATOMIC_RELEASE);
            (void)fa_opt(FA_OPT_LOG); /* this thread loads */
            pthread_join(t, NULL);
            _exit(seen_threshold == want_threshold && seen_report == want_report ? 0 : 1);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        zeros += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    assert_int_equal(zeros, 0);
}

/* SIZE settings have ranges and rules in the table: out of range or not a
 * power of two is invalid (one line, the default used, and
 * FORGEALLOC_STRICT refuses it). */
static void test_size_ranges(void **state)
{
    (void)state;
    assert_int_equal(parse_ok(FA_OPT_DEVICE_CHUNK_SIZE, "128M").u, 128ull << 20);
    assert_int_equal(parse_ok(FA_OPT_DEVICE_CHUNK_SIZE, "1M").u, 1ull << 20);
    assert_int_equal(parse_ok(FA_OPT_DEVICE_CHUNK_SIZE, "1T").u, 1ull << 40);
    parse_bad(FA_OPT_DEVICE_CHUNK_SIZE, "3M");     /* not a power of two */
    parse_bad(FA_OPT_DEVICE_CHUNK_SIZE, "512K");   /* below 1M */
    parse_bad(FA_OPT_DEVICE_CHUNK_SIZE, "2T");     /* above 1T */
    parse_bad(FA_OPT_DEVICE_CHUNK_SIZE, "0");
    assert_int_equal(parse_ok(FA_OPT_RELEASE_THRESHOLD, "0").u, 0);
    parse_bad(FA_OPT_RELEASE_THRESHOLD, "2T");
    parse_bad(FA_OPT_LARGE_ALLOC_REPORT, "99999999T");
    char out[2048];
    char *env[] = {"FORGEALLOC_DEVICE_CHUNK_SIZE=3M", NULL};
    fa_capture_stderr_begin();
    assert_int_equal(fa_options_load(env), 1); /* what FORGEALLOC_STRICT counts */
    fa_capture_stderr_end(out, sizeof out);
    assert_string_equal(out, "forgealloc: FORGEALLOC_DEVICE_CHUNK_SIZE='3M' is not a power of two from 1.00 MiB to "
                             "1.00 TiB (use 64M, 256MiB or 1G); using 64.0 MiB\n");
    assert_int_equal(fa_opt_u64(FA_OPT_DEVICE_CHUNK_SIZE), 64ull << 20);
    char *none[] = {NULL};
    fa_options_load(none);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrent_first_load), /* first: the process must not have loaded yet */
        cmocka_unit_test(test_size_ranges),
        cmocka_unit_test(test_sizes),           cmocka_unit_test(test_size_or_percent),
        cmocka_unit_test(test_numbers),         cmocka_unit_test(test_seconds),
        cmocka_unit_test(test_bool_enum_path),  cmocka_unit_test(test_defaults_parse),
        cmocka_unit_test(test_load_and_messages), cmocka_unit_test(test_rendering),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
