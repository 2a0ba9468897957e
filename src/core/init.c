/* init.c - process lifecycle: start, fork, exit and signals.
 *
 * Settings load lazily at the first allocation (which comes before any
 * constructor).  The constructor runs after tcmalloc's initialisers, so it
 * is where tcmalloc's load-time settings are overridden; the destructor
 * writes the exit dump.  An unhandled SIGTERM or SIGINT (docker stop,
 * Ctrl-C) skips atexit and destructors, so when a dump is configured a
 * handler writes it and the process still dies of the signal. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../device/device.h"
#include "../host/host.h"
#include "../host/served.h"
#include "../stats/report.h"
#include "../stats/stats.h"
#include "fmt.h"
#include "forgealloc.h"
#include "log.h"
#include "options.h"

static const int dump_signals[] = {SIGTERM, SIGINT};
static bool interval_running;

static void on_signal(int sig)
{
    /* Our handler is only installed where the default was to die: dump,
     * then die of the same signal so the exit status stays 128+sig. */
    fa_report_configured("signal", true);
    fa_report_abandon();
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(sig, &dfl, NULL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    raise(sig);
}

static void install_signal_dump(void)
{
    for (size_t i = 0; i < sizeof dump_signals / sizeof dump_signals[0]; i++) {
        struct sigaction old;
        if (sigaction(dump_signals[i], NULL, &old) != 0 || old.sa_handler != SIG_DFL ||
            (old.sa_flags & SA_SIGINFO))
            continue; /* the program (or its parent) chose a disposition: keep out of its way */
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_signal;
        sigfillset(&sa.sa_mask);
        sa.sa_flags = SA_RESTART;
        sigaction(dump_signals[i], &sa, NULL);
    }
}

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
    fa_host_served_check();
    pthread_atfork(fork_prepare, fork_parent, fork_child);
    if (fa_opt_u64(FA_OPT_STATS) != FA_STATS_OFF && fa_opt_u64(FA_OPT_STATS_ON_SIGNAL))
        install_signal_dump();
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
