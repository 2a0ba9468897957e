/* init.c - process lifecycle: start, fork and exit.
 *
 * Settings load lazily at the first allocation (which comes before any
 * constructor).  The constructor runs after tcmalloc's initialisers, so it
 * is where tcmalloc's load-time settings are overridden; the destructor
 * writes the exit dump.  The dump on SIGTERM and SIGINT is signals.c's. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../device/device.h"
#include "../host/host.h"
#include "../stats/report.h"
#include "../stats/stats.h"
#include "fmt.h"
#include "forgealloc.h"
#include "log.h"
#include "options.h"
#include "signals.h"

static bool interval_running;

static void *interval_main(void *arg)
{
    (void)arg;
    uint64_t ms = fa_opt_u64(FA_OPT_STATS_INTERVAL);
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    for (;;) {
        while (nanosleep(&ts, &ts) != 0)
            ;
        ts = (struct timespec){(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
        fa_report_configured("interval", false);
    }
    return NULL;
}

static void start_interval(void)
{
    const char *path = fa_opt(FA_OPT_STATS_FILE)->s;
    if (fa_opt_u64(FA_OPT_STATS_INTERVAL) == 0 || fa_opt_u64(FA_OPT_STATS) == FA_STATS_OFF)
        return;
    if (!path || strcmp(path, "-") == 0) {
        fa_warn("FORGEALLOC_STATS_INTERVAL needs FORGEALLOC_STATS_FILE set to a path; periodic dumps are off");
        return;
    }
    /* The thread blocks every signal so SIGTERM and friends reach the
     * program's own threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    pthread_t t;
    if (pthread_create(&t, &attr, interval_main, NULL) == 0) {
        interval_running = true;
        pthread_setname_np(t, "forgealloc");
    } else {
        fa_warn("cannot start the FORGEALLOC_STATS_INTERVAL thread; periodic dumps are off");
    }
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

static void fork_prepare(void)
{
    fa_device_fork_prepare();
    fa_stats_fork_prepare();
}

static void fork_parent(void)
{
    fa_stats_fork_parent();
    fa_device_fork_parent();
}

static void fork_child(void)
{
    fa_stats_fork_child();
    fa_device_fork_child();
    fa_host_fork_child();
    fa_report_fork_child();
    interval_running = false;
    start_interval();
}

__attribute__((constructor)) static void fa_start(void)
{
    fa_host_start();
    pthread_atfork(fork_prepare, fork_parent, fork_child);
    fa_signals_start();
    start_interval();
    if (fa_log_enabled(FA_LOG_INFO)) {
        char line[900];
        fa_buf b;
        fa_buf_init(&b, line, sizeof line);
        fa_options_echo(&b);
        fa_info("forgealloc %s in pid %d; %s", FORGEALLOC_VERSION, (int)getpid(), line);
    }
}

__attribute__((destructor)) static void fa_stop(void) { fa_report_configured("exit", false); }
