/* render.h - a snapshot as text, JSON ("forgealloc.stats/1") or Prometheus
 * exposition text.  Pure functions over fa_snapshot into a fa_buf: no
 * allocation, no I/O. */
#ifndef FA_RENDER_H
#define FA_RENDER_H

#include "../core/fmt.h"
#include "../core/options.h"
#include "snapshot.h"

#define FA_STATS_SCHEMA "forgealloc.stats/1"

void fa_render_json(fa_buf *b, const fa_snapshot *s);
void fa_render_text(fa_buf *b, const fa_snapshot *s);
void fa_render_prometheus(fa_buf *b, const fa_snapshot *s);
/* Dispatch on an fa_stats_format value (OFF renders nothing). */
void fa_render(fa_buf *b, const fa_snapshot *s, enum fa_stats_format fmt);

#endif
