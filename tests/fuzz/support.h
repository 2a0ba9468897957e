/* support.h - shared pieces of the fuzz harnesses: reading fields from the
 * fuzzer's bytes, turning bytes into an environment block, loading settings
 * without printing, the fa_buf truncation check and a strict JSON and UTF-8
 * validator.  Every check that fails prints one line and calls abort(), so
 * libFuzzer records the input and the replay test fails. */
#ifndef FA_FUZZ_SUPPORT_H
#define FA_FUZZ_SUPPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../../src/core/fmt.h"

#define FZ_CHECK(cond)                                     \
    do {                                                   \
        if (!(cond))                                       \
            fz_fail(#cond, __FILE__, __LINE__);            \
    } while (0)
_Noreturn void fz_fail(const char *what, const char *file, int line);

/* Fields taken from the front of the input; once it is used up every
 * field reads as zero (or empty), so short inputs are still meaningful. */
typedef struct fz_reader {
    const uint8_t *p;
    size_t n;
} fz_reader;

uint8_t fz_u8(fz_reader *r);
uint32_t fz_u32(fz_reader *r);
uint64_t fz_u64(fz_reader *r); /* 8 bytes, little-endian */
/* A counter: one tag byte; below 0x80 it is the value, otherwise
 * (tag & 7) + 1 further bytes hold it.  Small and huge values both stay
 * cheap for the fuzzer to reach. */
uint64_t fz_num(fz_reader *r);
/* Up to `max` bytes copied to a NUL-terminated string in out[max + 1]:
 * the length comes from one byte (two when max > 255). */
size_t fz_str(fz_reader *r, char *out, size_t max);

/* An environment block made of bytes: entries separated by NUL or newline,
 * the last one ending at the end of the input.  fz_env_free releases it. */
typedef struct fz_env {
    char *text;
    char **envp; /* NULL-terminated */
    size_t count;
} fz_env;

#define FZ_ENV_MAX 256 /* entries beyond this are dropped */

void fz_env_make(fz_env *e, const uint8_t *data, size_t n);
void fz_env_free(fz_env *e);

/* fa_options_load writes a line to fd 2 for every bad setting.
 * fz_options_init (call it once, from LLVMFuzzerInitialize) prepares a
 * /dev/null descriptor, sends sanitizer reports to a copy of stderr and
 * loads an empty environment, so that the settings start from their
 * defaults and fa_opt() never reads this process's environ (nor re-enters
 * fa_options_load from the log call of a first load that has a bad value).
 * fz_options_load_quietly points fd 2 at /dev/null only during the load:
 * libFuzzer's own output and the harness's failures stay visible. */
void fz_options_init(void);
int fz_options_load_quietly(char *const *envp);

/* `small` and `full` received the same writes; `full` is large enough to
 * hold them.  Checks the fa_buf contract on `small`: NUL-terminated when
 * cap > 0, len < cap, need >= len, the same need as `full`, and its text is
 * the longest prefix of `full`'s that fits. */
void fz_check_truncation(const fa_buf *small, const fa_buf *full);

/* All of s[0..n) is well-formed UTF-8 without NUL bytes. */
bool fz_utf8_valid(const char *s, size_t n);
/* s[0..n) is exactly one JSON value (RFC 8259) with optional surrounding
 * whitespace: strings must be UTF-8 without raw control characters, and
 * nesting deeper than 64 levels is refused. */
bool fz_json_valid(const char *s, size_t n);

#endif
