/* report.h - take a snapshot of the whole process and deliver it: to a file
 * descriptor, a caller's buffer, or where FORGEALLOC_STATS and
 * FORGEALLOC_STATS_FILE say (exit, interval and signal dumps). */
#ifndef FA_REPORT_H
#define FA_REPORT_H

#include <stdbool.h>
#include <stddef.h>

#include "../core/options.h"
#include "snapshot.h"

void fa_snapshot_take(fa_snapshot *s, const char *reason, bool in_signal);
/* Returns 0 or an errno value. */
int fa_report_fd(int fd, enum fa_stats_format fmt, const char *reason);
/* JSON into buf; returns the full length (see forgealloc_stats_json). */
size_t fa_report_json(char *buf, size_t len, const char *reason);
/* The configured dump; nothing when FORGEALLOC_STATS=off.  `in_signal`
 * selects buffers a handler may use while a normal dump is under way; a
 * second signal dump waits for the first, and one that interrupts a signal
 * dump on its own thread writes nothing. */
void fa_report_configured(const char *reason, bool in_signal);
/* In a signal handler about to re-raise: remove a half-written temporary. */
void fa_report_abandon(void);
/* After fork, in the child. */
void fa_report_fork_child(void);

#endif
