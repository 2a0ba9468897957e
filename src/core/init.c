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
#include <unistd.h>

#include "../device/device.h"
#include "../host/host.h"
#include "../host/served.h"
#include "../process/background.h"
#include "../stats/report.h"
#include "../stats/stats.h"
#include "fmt.h"
#include "forgealloc.h"
#include "log.h"
#include "options.h"

static const int dump_signals[] = {SIGTERM, SIGINT};

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
    fa_background_fork_child();
}

__attribute__((constructor)) static void fa_start(void)
{
    fa_host_start();
    fa_host_served_check();
    pthread_atfork(fork_prepare, fork_parent, fork_child);
    if (fa_opt_u64(FA_OPT_STATS) != FA_STATS_OFF && fa_opt_u64(FA_OPT_STATS_ON_SIGNAL))
        install_signal_dump();
    fa_background_start();
    if (fa_log_enabled(FA_LOG_INFO)) {
        char line[900];
        fa_buf b;
        fa_buf_init(&b, line, sizeof line);
        fa_options_echo(&b);
        fa_info("forgealloc %s in pid %d; %s", FORGEALLOC_VERSION, (int)getpid(), line);
    }
}

__attribute__((destructor)) static void fa_stop(void)
{
    fa_background_stop();
    fa_report_configured("exit", false);
}
