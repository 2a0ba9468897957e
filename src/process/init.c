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
#include <unistd.h>

#include "../core/log.h"
#include "../device/device.h"
#include "../host/host.h"
#include "../host/served.h"
#include "background.h"
#include "report.h"
#include "../stats/stats.h"
#include "../core/fmt.h"
#include "forgealloc.h"
#include "../core/log.h"
#include "../core/onstack.h"
#include "../core/options.h"
#include "../core/owner.h"
#include "signals.h"

static void fork_prepare(void)
{
    fa_background_fork_prepare();
    fa_stats_fork_prepare();
}

static void fork_parent(void)
{
    fa_stats_fork_parent();
    fa_background_fork_parent();
}

static void fork_child(void)
{
    fa_stats_fork_child();
    fa_device_fork_child();
    fa_host_fork_child();
    fa_report_fork_child();
    fa_background_fork_child();
    fa_signals_fork_child();
    fa_owner_claim();
}

/* The child of a fork that ran no fork handlers (_Fork, the fork or clone
 * system call), at its first call that looks (owner.h): what fork_child
 * does, with only async-signal-safe calls (the parent may have had other
 * threads).  Its background thread starts at its next allocating call, its
 * dumps say it was forked, and the parent's device pools are not its.  Its
 * counts started at zero at the fork itself (stats.h). */
static void adopt(void)
{
    fa_device_fork_child();
    fa_host_adopt();
    fa_report_fork_child();
    fa_background_adopt();
    fa_signals_fork_child();
}

__attribute__((constructor)) static void fa_start(void)
{
    fa_owner_start(adopt);
    fa_stderr_note();
    fa_report_start();
    fa_host_start();
    fa_host_served_check();
    fa_host_cxx_check();
    fa_host_start_pages();
    pthread_atfork(fork_prepare, fork_parent, fork_child);
    fa_signals_start();
    fa_background_start();
    if (fa_log_enabled(FA_LOG_INFO)) {
        char line[900];
        fa_buf b;
        fa_buf_init(&b, line, sizeof line);
        fa_options_echo(&b);
        fa_info("forgealloc %s in pid %d; %s", FORGEALLOC_VERSION, (int)getpid(), line);
    }
}

/* exit() called from a signal handler (common in C programs, though exit
 * is not async-signal-safe) may have interrupted this very thread inside
 * tcmalloc or a report, holding their locks.  A handler runs with its
 * signal blocked and set to the handler: such a signal at exit says it may,
 * and the dump is then made as in a signal handler (tcmalloc's numbers from
 * the last copy, their age shown).  A signal kept blocked with no handler
 * (sigwait, signalfd, Python's pthread_sigmask) is no sign of one.  Programs
 * that simply exit have nothing blocked (bash, dash, CPython, git, gcc); a
 * handler set with SA_NODEFER or SA_RESETHAND is not seen. */
static bool maybe_in_handler(void)
{
    sigset_t cur;
    if (pthread_sigmask(SIG_BLOCK, NULL, &cur) != 0 || sigisemptyset(&cur))
        return false;
    for (int sig = 1; sig < NSIG; sig++)
        if (sigismember(&cur, sig) == 1 && fa_signals_handled(sig))
            return true;
    return false;
}

/* A vfork child (or a clone that shares our memory) that calls exit()
 * instead of _exit() runs this in the parent's memory: it would stop the
 * parent's background thread (no more periodic dumps or returns to the
 * OS there) and write the parent's numbers under its own pid.  It leaves
 * everything as it is. */
static void exit_dump_in_handler(void *unused)
{
    (void)unused;
    fa_report_configured("exit", true);
}

__attribute__((destructor)) static void fa_stop(void)
{
    if (!fa_owner_mine())
        return;
    fa_background_stop();
    fa_host_stop();
    if (!maybe_in_handler()) {
        fa_report_configured("exit", false);
    } else if (fa_report_signal_enter()) {
        fa_on_stack(exit_dump_in_handler, NULL); /* the handler's stack may be small */
        fa_report_signal_leave();
    }
}
