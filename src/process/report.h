/* report.h - take a snapshot of the whole process and deliver it: to a file
 * descriptor, a caller's buffer, or where FORGEALLOC_STATS and
 * FORGEALLOC_STATS_FILE say (exit, interval and signal dumps). */
#ifndef FA_REPORT_H
#define FA_REPORT_H

#include <stdbool.h>
#include <stddef.h>

#include "../core/options.h"
#include "../stats/snapshot.h"

void fa_snapshot_take(fa_snapshot *s, const char *reason, bool in_signal);
/* Returns 0 or an errno value. */
int fa_report_fd(int fd, enum fa_stats_format fmt, const char *reason);
/* glibc's malloc_stats(): the text report on stderr (override_stats.c). */
void fa_report_malloc_stats(void);
/* JSON into buf; returns the full length (see forgealloc_stats_json). */
size_t fa_report_json(char *buf, size_t len, const char *reason);
/* At library start: note the process's stdout (the exit dump flushes it
 * first). */
void fa_report_start(void);
/* The configured dump; nothing when FORGEALLOC_STATS=off.  `in_signal`
 * selects buffers a handler may use while a normal dump is under way; the
 * caller holds them (fa_report_signal_enter). */
void fa_report_configured(const char *reason, bool in_signal);
/* A signal handler takes the signal buffers before dumping and keeps them
 * until the process is gone, so a signal on another thread cannot start a
 * second dump that the death of the process would cut short: it waits here.
 * False, at once, when this thread holds them already (a signal interrupted
 * its own signal dump). */
bool fa_report_signal_enter(void);
void fa_report_signal_leave(void);
/* In a signal handler about to re-raise: remove a half-written temporary. */
void fa_report_abandon(void);
/* After fork, in the child. */
void fa_report_fork_child(void);

#endif
