/* test_render.c - the three renderings of a hand-made snapshot: JSON
 * parses and holds every contract key, Prometheus passes a line check,
 * text names what matters; and a full buffer truncates cleanly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "../../src/stats/render.h"
#include "testutil.h"

static fa_snapshot snap;
static char out[256 * 1024];

static void fill(fa_snapshot *s)
{
    memset(s, 0, sizeof *s);
    fa_options_copy(s->settings);
    s->pid = 4242;
    s->ppid = 1;
    strcpy(s->exe, "/usr/bin/python3 \"quoted\"\\dir\xff");
    s->reason = "exit";
    for (int i = 0; i < FA_CALL_COUNT; i++)
        s->host.calls[i] = 1000u + (uint64_t)i;
    s->host.bytes_requested = 123456789;
    s->host.large_allocs = 2;
    s->host.hist[0] = 3;
    s->host.hist[5] = 70;
    s->host.hist[FA_HIST_BUCKETS - 1] = 1;
    s->rss_bytes = 100 << 20;
    s->peak_rss_bytes = 900 << 20;
    s->tc_valid = true;
    for (int i = 0; i < FA_TC_COUNT; i++)
        s->tc[i] = (uint64_t)(i + 1) << 20;
    s->release_rate = 10;
    for (int i = 0; i < FA_REL_COUNT; i++)
        s->released_by[i] = (uint64_t)(i + 1) << 20;
    s->release_hold_ms = 3500;
    s->release_background = true;
    s->stat_records = 7;
    s->cuda_seen = true;
    s->ndevices = 2;
    for (int d = 0; d < 2; d++) {
        s->dev[d].device = d;
        s->dev[d].pool_bytes = 1ull << 30;
        s->dev[d].pool_allocs = 90;
        s->dev[d].fallback_allocs = 10;
        s->dev[d].allocs = 100;
        s->dev[d].waste_bytes = 4096;
    }
}

static const char *render(enum fa_stats_format f)
{
    fa_buf b;
    fa_buf_init(&b, out, sizeof out);
    fa_render(&b, &snap, f);
    assert_false(fa_buf_overflowed(&b));
    return out;
}

static void test_json_contract(void **state)
{
    (void)state;
    fill(&snap);
    const char *j = render(FA_STATS_JSON);
    assert_true(fa_python_check("import runpy,sys; sys.argv=[\"c\"]; runpy.run_path(\"" FA_TEST_SRCDIR
                                "/tests/check_stats_json.py\", run_name=\"__main__\")",
                                j));
    /* Exact values round-trip. */
    assert_true(fa_python_check("import json,sys; d=json.load(sys.stdin); "
                                "assert d[\"host\"][\"calls\"][\"malloc\"]==1000, d; "
                                "assert d[\"host\"][\"calls\"][\"delete\"]==1011; "
                                "assert d[\"pid\"]==4242; assert d[\"exe\"].startswith(\"/usr/bin/python3\"); "
                                "assert d[\"device\"][\"devices\"][1][\"device\"]==1; "
                                "h=d[\"host\"][\"size_histogram\"]; assert [b[\"count\"] for b in h]==[3,70,1], h; "
                                "assert h[1][\"min\"]==16 and h[1][\"max\"]==31; "
                                "r=d[\"host\"][\"release\"]; assert r[\"pressure_bytes\"]==3<<20, r; "
                                "assert r[\"held_free_bytes\"]==3<<20 and r[\"hold_ms\"]==3500; "
                                "assert r[\"background\"] is True and d[\"host\"][\"thread_records\"]==7",
                                j));
    /* tcmalloc unreadable (signal inside malloc): null, still valid JSON. */
    snap.tc_valid = false;
    j = render(FA_STATS_JSON);
    assert_true(fa_python_check("import json,sys; d=json.load(sys.stdin); "
                                "assert d[\"host\"][\"tcmalloc\"][\"heap_size\"] is None; "
                                "assert \"held_free_bytes\" not in d[\"host\"][\"release\"]",
                                j));
}

static void test_prometheus_lines(void **state)
{
    (void)state;
    fill(&snap);
    const char *p = render(FA_STATS_PROMETHEUS);
    assert_true(fa_python_check(
        "import re,sys\n"
        "typed=set()\n"
        "sample=re.compile(r'^(forgealloc_[a-z0-9_]+)\\{([a-z_]+=\"(\\\\.|[^\"\\\\])*\")(,[a-z_]+=\"(\\\\.|[^\"\\\\])*\")*\\} [0-9]+$')\n"
        "n=0\n"
        "for line in sys.stdin.read().splitlines():\n"
        "    if line.startswith('# HELP '): continue\n"
        "    if line.startswith('# TYPE '):\n"
        "        name,kind=line.split()[2:4]; assert kind in ('counter','gauge','histogram'), line; typed.add(name); continue\n"
        "    m=sample.match(line); assert m, line\n"
        "    base=re.sub('_(bucket|sum|count)$','',m.group(1))\n"
        "    assert m.group(1) in typed or base in typed, line\n"
        "    n+=1\n"
        "assert n>50, n\n",
        p));
    assert_non_null(strstr(p, "forgealloc_host_calls_total{pid=\"4242\",function=\"malloc\"} 1000\n"));
    assert_non_null(strstr(p, "forgealloc_host_alloc_size_bytes_bucket{pid=\"4242\",le=\"+Inf\"} 74\n"));
    assert_non_null(strstr(p, "forgealloc_device_pool_allocs_total{pid=\"4242\",device=\"1\"} 90\n"));
    /* The host metrics made from FA_HOST_FIELDS keep their names and types:
     * dashboards and alerts use them. */
    static const char *const host_metrics[] = {
        "host_large_allocs_total counter", "host_rss_bytes gauge", "host_peak_rss_bytes gauge",
        "host_releases_total counter", "host_released_bytes_total counter",
        "host_release_delay_bytes_total counter", "host_release_threshold_bytes_total counter",
        "host_release_pressure_bytes_total counter", "host_release_request_bytes_total counter",
        "host_release_hold_ms gauge",
    };
    for (size_t i = 0; i < sizeof host_metrics / sizeof host_metrics[0]; i++) {
        char line[128];
        snprintf(line, sizeof line, "\n# TYPE forgealloc_%s\n", host_metrics[i]);
        assert_non_null(strstr(p, line));
    }
    assert_non_null(strstr(p, "forgealloc_host_release_hold_ms{pid=\"4242\"} 3500\n"));
    assert_non_null(strstr(p, "forgealloc_host_release_pressure_bytes_total{pid=\"4242\"} 3145728\n"));
}

static void test_text(void **state)
{
    (void)state;
    fill(&snap);
    const char *t = render(FA_STATS_TEXT);
    assert_non_null(strstr(t, "pid 4242"));
    assert_non_null(strstr(t, "malloc 1,000"));
    assert_non_null(strstr(t, "rss 100 MiB (peak 900 MiB)"));
    assert_non_null(strstr(t, "device 1: pool 1.00 GiB"));
    snap.cuda_seen = false;
    t = render(FA_STATS_TEXT);
    assert_non_null(strstr(t, "device: no CUDA calls"));
}

/* Another allocator ahead of forgealloc: every format says so, and none
 * shows tcmalloc's numbers as the process's. */
static void test_served_by_other(void **state)
{
    (void)state;
    fill(&snap);
    snap.malloc_server = FA_SERVER_OTHER;
    snap.served_by = "/usr/lib/libjemalloc.so.2";
    snap.tc_valid = false; /* what the host fill does for another allocator */
    const char *j = render(FA_STATS_JSON);
    assert_true(fa_python_check("import runpy,sys; sys.argv=[\"c\"]; runpy.run_path(\"" FA_TEST_SRCDIR
                                "/tests/check_stats_json.py\", run_name=\"__main__\")",
                                j));
    assert_true(fa_python_check("import json,sys; d=json.load(sys.stdin); h=d[\"host\"]; "
                                "assert h[\"interposed\"] is False and h[\"served_by\"]==\"/usr/lib/libjemalloc.so.2\"; "
                                "assert h[\"tcmalloc\"][\"serves_malloc\"] is False; "
                                "assert h[\"tcmalloc\"][\"heap_size\"] is None",
                                j));
    const char *t = render(FA_STATS_TEXT);
    assert_non_null(strstr(t, "malloc served by /usr/lib/libjemalloc.so.2 ahead of forgealloc"));
    assert_null(strstr(t, "tcmalloc: in use"));
    const char *p = render(FA_STATS_PROMETHEUS);
    assert_non_null(strstr(p, "forgealloc_host_interposed{pid=\"4242\",served_by=\"/usr/lib/libjemalloc.so.2\"} 0\n"));
    assert_null(strstr(p, "forgealloc_tcmalloc_"));
    /* The same tcmalloc ahead of forgealloc: its numbers are the process's. */
    fill(&snap);
    snap.malloc_server = FA_SERVER_SAME_TCMALLOC;
    snap.served_by = "/usr/lib/libtcmalloc_minimal.so.4";
    j = render(FA_STATS_JSON);
    assert_true(fa_python_check("import json,sys; d=json.load(sys.stdin); h=d[\"host\"]; "
                                "assert h[\"interposed\"] is False and h[\"tcmalloc\"][\"serves_malloc\"] is True; "
                                "assert h[\"tcmalloc\"][\"heap_size\"]==2<<20",
                                j));
    t = render(FA_STATS_TEXT);
    assert_non_null(strstr(t, "the tcmalloc numbers are the process's"));
    /* Ours (a zeroed snapshot): interposed. */
    fill(&snap);
    j = render(FA_STATS_JSON);
    assert_true(fa_python_check("import json,sys; d=json.load(sys.stdin); "
                                "assert d[\"host\"][\"interposed\"] is True and d[\"host\"][\"served_by\"] is None",
                                j));
    assert_null(strstr(render(FA_STATS_TEXT), "malloc served by"));
}

static void test_truncation(void **state)
{
    (void)state;
    fill(&snap);
    char small[100];
    fa_buf b;
    fa_buf_init(&b, small, sizeof small);
    fa_render_json(&b, &snap);
    assert_true(fa_buf_overflowed(&b));
    assert_int_equal(strlen(small), sizeof small - 1);
    assert_true(b.need > 1000);
}

int main(void)
{
    char *none[] = {NULL};
    fa_options_load(none);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_contract), cmocka_unit_test(test_prometheus_lines),
        cmocka_unit_test(test_text), cmocka_unit_test(test_served_by_other), cmocka_unit_test(test_truncation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
