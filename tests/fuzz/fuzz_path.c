/* fuzz_path.c - libFuzzer harness for fa_path_expand (src/stats/file.c),
 * which turns FORGEALLOC_STATS_FILE into a path.
 *
 * Input: 2 bytes of output capacity (0..4999), 4 bytes of pid (any int,
 * negative ones included), then the template (up to the first NUL).
 * Checks, against an expansion written here with snprintf ("%p" -> pid,
 * "%h" -> a fixed host, "%t" -> a fixed start time, "%%" -> "%",
 * everything else copied): the result is true exactly when
 * the expansion is non-empty and fits with its NUL; the output is never
 * written past `cap`, is NUL-terminated when cap > 0 and is the longest
 * prefix of the expansion that fits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/stats/file.h"
#include "support.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_reader r = {data, size};
    size_t cap = (fz_u8(&r) | (size_t)fz_u8(&r) << 8) % 5000;
    int pid = (int)fz_u32(&r);
    char *tmpl = malloc(r.n + 1);
    memcpy(tmpl, r.p, r.n);
    tmpl[r.n] = '\0';

    fa_path_parts parts = {.pid = pid, .host = "box-3f2a", .start_unix_ms = 18446744073709551615u};
    /* Each template byte expands to at most 20 (UINT64_MAX for "%t"). */
    size_t want_cap = 20 * strlen(tmpl) + 1, wn = 0;
    char *want = malloc(want_cap);
    for (const char *c = tmpl; *c; c++) {
        if (c[0] == '%' && c[1] == 'p') {
            wn += (size_t)snprintf(want + wn, want_cap - wn, "%d", pid);
            c++;
        } else if (c[0] == '%' && c[1] == 'h') {
            wn += (size_t)snprintf(want + wn, want_cap - wn, "%s", parts.host);
            c++;
        } else if (c[0] == '%' && c[1] == 't') {
            wn += (size_t)snprintf(want + wn, want_cap - wn, "%llu", (unsigned long long)parts.start_unix_ms);
            c++;
        } else if (c[0] == '%' && c[1] == '%') {
            want[wn++] = '%';
            c++;
        } else {
            want[wn++] = *c;
        }
    }

    char *out = malloc(cap);
    bool ok = fa_path_expand(tmpl, &parts, out, cap);
    FZ_CHECK(ok == (wn > 0 && wn < cap));
    if (cap > 0) {
        size_t fits = wn < cap - 1 ? wn : cap - 1;
        FZ_CHECK(out[fits] == '\0' && memcmp(out, want, fits) == 0);
    }
    free(out);
    free(want);
    free(tmpl);
    return 0;
}
