/* override_stats.c - malloc_stats, the one libc allocator name whose answer
 * is the process's report (report.c) rather than the host core's: the text
 * report on stderr, also when a library constructor that runs before
 * forgealloc's own calls it. */
#include "../host/lookup.h"
#include "report.h"

FA_LIBC_MALLOC(malloc_stats) void malloc_stats(void) { fa_report_malloc_stats(); }
