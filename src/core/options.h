/* options.h - FORGEALLOC_* settings: the table (options.def), the parser
 * and the effective values.
 *
 * The environment is read lazily, without allocating, by scanning environ:
 * malloc runs before any constructor, so the first allocation may be the
 * one that loads the settings. */
#ifndef FA_OPTIONS_H
#define FA_OPTIONS_H

#include <stdbool.h>
#include <stdint.h>

#include "fmt.h"

typedef enum {
    FA_TYPE_SIZE,     /* bytes; K/M/G/T with optional B or iB, binary; within [min, max] bytes unless both are 0 */
    FA_TYPE_SIZE_POW2, /* a SIZE that is also a power of two */
    FA_TYPE_SIZE_PCT, /* a size, or N% (decimal) within [min, max] */
    FA_TYPE_NUM,      /* decimal within [min, max] */
    FA_TYPE_INT,      /* whole number within [min, max] */
    FA_TYPE_SECONDS,  /* decimal with optional s/ms/m; stored in ms */
    FA_TYPE_BOOL,     /* 1/0, true/false, yes/no, on/off */
    FA_TYPE_ENUM,     /* one of desc->choices ("a|b|c"), stored as index */
    FA_TYPE_PATH,     /* non-empty text, copied */
} fa_opt_type;

typedef enum { FA_SCOPE_LIB, FA_SCOPE_LAUNCHER } fa_opt_scope;

typedef struct fa_option_desc {
    const char *name; /* "FORGEALLOC_STATS" */
    fa_opt_type type;
    const char *def;  /* default, written as a user would write it */
    double min, max;  /* NUM, SECONDS, the percent form of SIZE_PCT; bytes for SIZE, SIZE_POW2 */
    const char *choices;
    fa_opt_scope scope;
    const char *doc;
} fa_option_desc;

/* Byte bounds in option rows. */
#define FA_MiB 1048576.0
#define FA_TiB 1099511627776.0

enum fa_opt_id {
#define FA_OPTION(id, type, def, min, max, choices, scope, doc) FA_OPT_##id,
#include "options.def"
#undef FA_OPTION
    FA_OPT_COUNT
};

enum fa_opt_source { FA_SRC_DEFAULT, FA_SRC_ENV, FA_SRC_INVALID };

typedef struct fa_optval {
    uint64_t u;  /* SIZE: bytes; BOOL: 0/1; ENUM: index; SECONDS: ms */
    double d;    /* NUM: value; SIZE_PCT: percent when is_pct */
    bool is_pct; /* SIZE_PCT given as a percentage */
    const char *s; /* PATH: the copied text */
    enum fa_opt_source src;
} fa_optval;

extern const fa_option_desc fa_option_table[FA_OPT_COUNT];

/* Values of FA_OPT_STATS and FA_OPT_LOG, in the order of their choices. */
enum fa_stats_format { FA_STATS_OFF, FA_STATS_TEXT, FA_STATS_JSON, FA_STATS_PROMETHEUS };
enum fa_log_level { FA_LOG_ERROR, FA_LOG_WARN, FA_LOG_INFO, FA_LOG_DEBUG };

/* Parse `text` as a value of option `d`.  On failure returns false and sets
 * *expected to a phrase such as "a size (use 4G, 512MiB or 40%)".
 * PATH values point into `text`; the caller copies them. */
bool fa_option_parse(const fa_option_desc *d, const char *text, fa_optval *out, const char **expected);

/* The effective values, loaded on first use from environ. */
const fa_optval *fa_opt(enum fa_opt_id id);
static inline uint64_t fa_opt_u64(enum fa_opt_id id) { return fa_opt(id)->u; }

/* Load (or reload, after fork in tests) from an environment block.  Bad
 * values are logged one line each and replaced by the default.  Returns the
 * number of invalid settings. */
int fa_options_load(char *const *envp);
/* Number of invalid settings seen by the last load. */
int fa_options_invalid_count(void);
/* Number of FORGEALLOC_* names the last load found that are no setting
 * (each told in one line; FORGEALLOC_STRICT refuses them too). */
int fa_options_unknown_count(void);

/* The effective values, all at once: what a stats snapshot carries. */
void fa_options_copy(fa_optval out[FA_OPT_COUNT]);

/* The effective value as text ("64 MiB", "json", "12.5%"). */
void fa_option_format(fa_buf *b, enum fa_opt_id id);
/* The same for a value of option `id` held elsewhere (a snapshot's copy). */
void fa_option_format_value(fa_buf *b, enum fa_opt_id id, const fa_optval *v);
/* Append {"name":..., "type":..., ...} objects for every option: what
 * forgealloc_options_json() and `forgealloc env` show. */
void fa_options_json(fa_buf *b);
/* One line with every library setting: the verbose echo at FORGEALLOC_LOG=info. */
void fa_options_echo(fa_buf *b);

#endif
