/* test_release_policy.c - the release policy's pure parts: the window of
 * free-memory minima (decay.c) on a fake clock and made-up demand series,
 * and the parsing behind the memory-pressure check (pressure.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "testutil.h"
#include "../../src/host/decay.h"
#include "../../src/host/pressure.h"

#define MB ((uint64_t)1 << 20)
#define WINDOW 2000 /* ms */

/* A sample with nothing returned to the OS: free and unused alike. */
static void observe(fa_decay *d, uint64_t t, uint64_t free_bytes) { fa_decay_observe(d, t, free_bytes, free_bytes); }

/* Nothing is idle before a whole window was seen, however much is free. */
static void test_nothing_idle_at_start(void **state)
{
    (void)state;
    fa_decay d;
    fa_decay_init(&d, WINDOW, 1000);
    observe(&d, 1000, 800 * MB);
    assert_int_equal(fa_decay_idle(&d), 0);
    observe(&d, 1000 + WINDOW - 1, 800 * MB);
    assert_int_equal(fa_decay_idle(&d), 0);
}

/* A model unloaded, then no activity: all of it is idle once the window
 * has passed, and not before. */
static void test_idle_after_unload(void **state)
{
    (void)state;
    fa_decay d;
    fa_decay_init(&d, WINDOW, 0);
    for (uint64_t t = 0; t < 5000; t += 100)
        observe(&d, t, 10 * MB); /* steady */
    observe(&d, 5000, 810 * MB);  /* the unload */
    fa_decay_advance(&d, 5000 + WINDOW / 2);
    assert_int_equal(fa_decay_idle(&d), 10 * MB);
    fa_decay_advance(&d, 5000 + WINDOW + WINDOW / (FA_DECAY_SLOTS - 1));
    assert_int_equal(fa_decay_idle(&d), 810 * MB);
    /* No sample at all for longer than the window: the level held. */
    fa_decay_advance(&d, 60000);
    assert_int_equal(fa_decay_idle(&d), 810 * MB);
}

/* A churn that dips into its free memory every 300 ms never leaves more
 * idle than its lowest dip, whatever the window's phase. */
static void test_churn_keeps_what_it_uses(void **state)
{
    (void)state;
    fa_decay d;
    fa_decay_init(&d, WINDOW, 0);
    for (uint64_t t = 0; t < 20000; t += 50) {
        uint64_t free_bytes = (t % 300 == 0) ? 4 * MB : 100 * MB + (t % 7) * MB;
        observe(&d, t, free_bytes);
        if (t >= WINDOW + 300)
            assert_true(fa_decay_idle(&d) <= 4 * MB);
    }
}

/* Demand falls: the window slides past the old dips and the excess comes
 * back gradually, never more than what stayed free throughout. */
static void test_demand_falls(void **state)
{
    (void)state;
    fa_decay d;
    fa_decay_init(&d, WINDOW, 0);
    uint64_t t = 0;
    for (; t < 4000; t += 100)
        observe(&d, t, t % 200 == 0 ? 0 : 300 * MB); /* busy: dips to 0 */
    for (; t < 4000 + WINDOW + 500; t += 100) {
        observe(&d, t, 300 * MB); /* quiet */
        if (t < 4000 + WINDOW - WINDOW / (FA_DECAY_SLOTS - 1))
            assert_int_equal(fa_decay_idle(&d), 0);
    }
    assert_int_equal(fa_decay_idle(&d), 300 * MB);
}

/* What was released is not counted again. */
static void test_released_not_counted_twice(void **state)
{
    (void)state;
    fa_decay d;
    fa_decay_init(&d, WINDOW, 0);
    for (uint64_t t = 0; t <= 3000; t += 100)
        observe(&d, t, 500 * MB);
    assert_int_equal(fa_decay_idle(&d), 500 * MB);
    fa_decay_released(&d, 450 * MB);
    assert_int_equal(fa_decay_idle(&d), 50 * MB);
    fa_decay_released(&d, 900 * MB);
    assert_int_equal(fa_decay_idle(&d), 0);
    /* The clock going backwards (a sample taken late) changes nothing. */
    observe(&d, 100, 20 * MB);
    assert_int_equal(fa_decay_idle(&d), 0);
}

/* Demand: the largest amount taken from the heap at once within the
 * window, whether it came from free or from returned memory; a rise (a
 * model unloaded) is none, and it leaves the window with its slots. */
static void test_demand(void **state)
{
    (void)state;
    fa_decay d;
    fa_decay_init(&d, WINDOW, 0);
    assert_int_equal(fa_decay_demand(&d), 0);
    uint64_t t = 0;
    /* Steps of 600 MB taken from free memory and given back every 100 ms. */
    for (; t < 3000; t += 50)
        observe(&d, t, t % 100 == 0 ? 100 * MB : 700 * MB);
    assert_int_equal(fa_decay_demand(&d), 600 * MB);
    assert_int_equal(fa_decay_idle(&d), 100 * MB);
    /* 3 GB unloaded: a rise, no demand. */
    observe(&d, t, 3700 * MB);
    assert_int_equal(fa_decay_demand(&d), 600 * MB);
    /* Returned to the OS, then committed again by the next steps: still the
     * steps' demand, though the free bytes no longer fall. */
    fa_decay_released(&d, 3600 * MB);
    for (t += 50; t < 6000; t += 50)
        fa_decay_observe(&d, t, 100 * MB, t % 100 == 0 ? 3100 * MB : 3700 * MB);
    assert_int_equal(fa_decay_demand(&d), 600 * MB);
    /* A fall across slots: 200 MB taken in one slot, 300 MB more in the
     * next, counts as 500. */
    fa_decay d2;
    fa_decay_init(&d2, WINDOW, 0);
    observe(&d2, 0, 800 * MB);
    observe(&d2, 300, 600 * MB);
    observe(&d2, 600, 300 * MB);
    assert_int_equal(fa_decay_demand(&d2), 500 * MB);
    /* The steps stop: once the window has passed them, no demand is left. */
    for (t = 600; t < 600 + 2 * WINDOW; t += 100)
        observe(&d2, t, 300 * MB);
    assert_int_equal(fa_decay_demand(&d2), 0);
}

static void test_parse_limits(void **state)
{
    (void)state;
    uint64_t v;
    assert_true(fa_pressure_parse_limit("max\n", &v));
    assert_true(v == UINT64_MAX);
    assert_true(fa_pressure_parse_limit("734003200\n", &v));
    assert_true(v == 734003200);
    assert_true(fa_pressure_parse_limit("9223372036854771712\n", &v)); /* v1: no limit */
    assert_true(v == UINT64_MAX);
    assert_false(fa_pressure_parse_limit("", &v));
    assert_false(fa_pressure_parse_limit("-1", &v));
    assert_false(fa_pressure_parse_limit("99999999999999999999999", &v));
    assert_true(fa_pressure_parse_meminfo("MemTotal:       24684000 kB\nMemFree: 1 kB\nMemAvailable:   2000 kB\n", &v));
    assert_true(v == 2000 * 1024);
    assert_false(fa_pressure_parse_meminfo("MemTotal: 5 kB\n", &v));
    /* memory.stat: a whole key at the start of a line, not a longer one
     * that ends with it (v1 has inactive_file and total_inactive_file). */
    const char *v1stat = "cache 9252864\ninactive_file 12288\nactive_file 155648\ntotal_inactive_file 3829760\n";
    assert_true(fa_pressure_parse_stat(v1stat, "total_inactive_file", &v));
    assert_true(v == 3829760);
    assert_true(fa_pressure_parse_stat(v1stat, "inactive_file", &v));
    assert_true(v == 12288);
    assert_true(fa_pressure_parse_stat("anon 1\nfile 2\ninactive_file 42", "inactive_file", &v));
    assert_true(v == 42);
    assert_false(fa_pressure_parse_stat("active_file 7\n", "inactive_file", &v));
    assert_false(fa_pressure_parse_stat("inactive_file x\n", "inactive_file", &v));
    assert_false(fa_pressure_parse_stat("", "inactive_file", &v));
}

static void test_cgroup_dirs(void **state)
{
    (void)state;
    char dir[256];
    bool v1;
    size_t ml;
    const char *v2cg = "0::/system.slice/webui.service\n";
    assert_true(fa_pressure_cgroup_dir(
        v2cg, "30 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate", dir, sizeof dir, &v1,
        &ml));
    assert_string_equal(dir, "/sys/fs/cgroup/system.slice/webui.service");
    assert_false(v1);
    assert_int_equal(ml, strlen("/sys/fs/cgroup"));
    /* A container: the mount shows its own cgroup as the root. */
    assert_true(fa_pressure_cgroup_dir("0::/\n", "1 0 0:26 / /sys/fs/cgroup ro - cgroup2 cgroup2 rw", dir, sizeof dir,
                                       &v1, &ml));
    assert_string_equal(dir, "/sys/fs/cgroup");
    /* v1: the memory controller's line and mount; other controllers are not it. */
    const char *v1cg = "9:name=systemd:/\n4:memory:/process_api/ab12\n3:cpuset:/\n0::/\n";
    assert_true(fa_pressure_cgroup_dir(
        v1cg, "40 25 0:35 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory", dir, sizeof dir, &v1, &ml));
    assert_string_equal(dir, "/sys/fs/cgroup/memory/process_api/ab12");
    assert_true(v1);
    assert_false(fa_pressure_cgroup_dir(
        v1cg, "41 25 0:36 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset", dir, sizeof dir, &v1, &ml));
    /* A mount of a sub-tree: its root is stripped from the path. */
    assert_true(fa_pressure_cgroup_dir("4:memory:/docker/c0ffee\n",
                                       "50 25 0:35 /docker /mnt/mem rw - cgroup cgroup rw,memory", dir, sizeof dir,
                                       &v1, &ml));
    assert_string_equal(dir, "/mnt/mem/c0ffee");
    /* Mount points and roots with blanks are escaped in mountinfo. */
    assert_true(fa_pressure_cgroup_dir("0::/my\\x/app\n",
                                       "30 23 0:26 / /srv/cg\\040root\\134x rw - cgroup2 cgroup2 rw", dir,
                                       sizeof dir, &v1, &ml));
    assert_string_equal(dir, "/srv/cg root\\x/my\\x/app");
    assert_int_equal(ml, strlen("/srv/cg root\\x"));
    assert_true(fa_pressure_cgroup_dir("4:memory:/a b/c\n",
                                       "50 25 0:35 /a\\040b /mnt/mem rw - cgroup cgroup rw,memory", dir, sizeof dir,
                                       &v1, &ml));
    assert_string_equal(dir, "/mnt/mem/c");
    /* Not a cgroup mount at all. */
    assert_false(fa_pressure_cgroup_dir(v2cg, "22 1 8:1 / / rw - ext4 /dev/vda rw", dir, sizeof dir, &v1, &ml));
}

static void put(const char *dir, const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* A v2 cgroup whose parent does not enable the memory controller for it has
 * no memory.max of its own, yet its ancestors' limits bind it.  And a v2
 * hierarchy without the memory controller anywhere (a hybrid system's
 * unified mount) is passed over for the v1 memory hierarchy.  On a made-up
 * tree whose mount point has a blank in it. */
static void test_cgroup_leaf_without_limit(void **state)
{
    (void)state;
    char top[] = "/tmp/fa-cgroup-XXXXXX", d[256], mi[256], cg[256], line[1024];
    assert_non_null(mkdtemp(top));
    snprintf(d, sizeof d, "%s/cg 2", top);
    assert_int_equal(mkdir(d, 0755), 0);
    snprintf(d, sizeof d, "%s/cg 2/slice", top);
    assert_int_equal(mkdir(d, 0755), 0);
    put(d, "memory.max", "1048576\n");
    put(d, "memory.current", "262144\n");
    put(d, "memory.stat", "anon 262144\ninactive_file 0\n");
    snprintf(d, sizeof d, "%s/cg 2/slice/app", top);
    assert_int_equal(mkdir(d, 0755), 0); /* no memory.* files */
    snprintf(cg, sizeof cg, "%s/cgroup", top);
    snprintf(mi, sizeof mi, "%s/mountinfo", top);
    put(top, "cgroup", "0::/slice/app\n");
    snprintf(line, sizeof line, "22 1 8:1 / / rw - ext4 /dev/vda rw\n30 23 0:26 / %s/cg\\0402 rw - cgroup2 cgroup2 rw\n",
             top);
    put(top, "mountinfo", line);

    fa_pressure_use_sources(cg, mi);
    bool limited = false;
    assert_int_equal(fa_pressure_headroom(&limited), 1048576 - 262144);
    assert_true(limited);

    /* The controller nowhere in the v2 tree: the v1 memory hierarchy is it. */
    snprintf(d, sizeof d, "%s/cg 2/slice/memory.max", top);
    assert_int_equal(unlink(d), 0);
    snprintf(d, sizeof d, "%s/v1", top);
    assert_int_equal(mkdir(d, 0755), 0);
    put(d, "memory.limit_in_bytes", "2097152\n");
    put(d, "memory.usage_in_bytes", "1048576\n");
    put(d, "memory.stat", "total_inactive_file 0\n");
    put(top, "cgroup", "4:memory:/\n0::/slice/app\n");
    snprintf(line, sizeof line,
             "30 23 0:26 / %s/cg\\0402 rw - cgroup2 cgroup2 rw\n35 31 0:32 / %s/v1 rw - cgroup cgroup rw,memory\n", top,
             top);
    put(top, "mountinfo", line);
    fa_pressure_use_sources(cg, mi);
    assert_int_equal(fa_pressure_headroom(&limited), 1048576);
    assert_true(limited);

    fa_pressure_use_sources("/proc/self/cgroup", "/proc/self/mountinfo");
    assert_int_equal(fa_remove_tree(top), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nothing_idle_at_start), cmocka_unit_test(test_idle_after_unload),
        cmocka_unit_test(test_churn_keeps_what_it_uses), cmocka_unit_test(test_demand_falls),
        cmocka_unit_test(test_released_not_counted_twice), cmocka_unit_test(test_demand),
        cmocka_unit_test(test_parse_limits),
        cmocka_unit_test(test_cgroup_dirs), cmocka_unit_test(test_cgroup_leaf_without_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
