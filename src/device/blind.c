/* blind.c - settings under which PyTorch allocates device memory without
 * cudaMalloc: the pool then sees nothing, must not pre-reserve, and the
 * reports say why. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "devstate.h"

#include "../core/log.h"

static int blind_state;          /* 0 not decided yet, 1 not blind, 2 blind */
static const char *blind_reason; /* set before blind_state becomes 2 */

/* The value of the last `key:value` item of a PyTorch allocator setting
 * (later items override earlier ones; spaces around tokens are ignored)
 * equals `value`, case-insensitively. */
static bool conf_says(const char *conf, const char *key, const char *value)
{
    bool says = false;
    size_t klen = strlen(key), vlen = strlen(value);
    for (const char *c = conf; (c = strstr(c, key)); c++) {
        if (c != conf && c[-1] != ',' && c[-1] != ' ')
            continue;
        const char *v = c + klen;
        while (*v == ' ')
            v++;
        if (*v++ != ':')
            continue;
        while (*v == ' ')
            v++;
        size_t n = strcspn(v, ", ");
        says = n == vlen && strncasecmp(v, value, n) == 0;
    }
    return says;
}

#define FA_BLIND_REASON(var, what) var " asks for " what ", so PyTorch allocates without cudaMalloc"

/* Whether the environment configures PyTorch to allocate device memory
 * without cudaMalloc (expandable segments map memory with cuMemCreate;
 * the cudaMallocAsync backend uses stream-ordered pools), and why.
 * PyTorch 2.9 and later read PYTORCH_ALLOC_CONF, falling back to the
 * older PYTORCH_CUDA_ALLOC_CONF; earlier versions read only the latter.
 * The version is not known here, so either one counts.  Reads the
 * environment as it is now (programs often set these from Python before
 * importing torch); no allocation, no lock, no output: safe on the dump
 * and signal paths. */
static const char *blind_env(void)
{
    static const struct {
        const char *var, *key, *value, *reason;
    } rules[] = {
        {"PYTORCH_ALLOC_CONF", "expandable_segments", "true",
         FA_BLIND_REASON("PYTORCH_ALLOC_CONF", "expandable_segments:True")},
        {"PYTORCH_ALLOC_CONF", "backend", "cudaMallocAsync",
         FA_BLIND_REASON("PYTORCH_ALLOC_CONF", "backend:cudaMallocAsync")},
        {"PYTORCH_CUDA_ALLOC_CONF", "expandable_segments", "true",
         FA_BLIND_REASON("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")},
        {"PYTORCH_CUDA_ALLOC_CONF", "backend", "cudaMallocAsync",
         FA_BLIND_REASON("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync")},
    };
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) {
        const char *conf = getenv(rules[i].var);
        if (conf && conf_says(conf, rules[i].key, rules[i].value))
            return rules[i].reason;
    }
    return NULL;
}

bool fa_blind(void)
{
    if (__atomic_load_n(&blind_state, __ATOMIC_ACQUIRE))
        return blind_state == 2;
    const char *why = blind_env();
    if (why) {
        __atomic_store_n(&blind_reason, why, __ATOMIC_RELAXED);
        fa_info("device pool off: %s", why);
    }
    __atomic_store_n(&blind_state, why ? 2 : 1, __ATOMIC_RELEASE);
    return why != NULL;
}

/* Blind as decided when the pool was sized; before any cudaMalloc
 * (PyTorch under these settings never calls it), as the environment says
 * now. */
const char *fa_blind_reason(void)
{
    int bs = __atomic_load_n(&blind_state, __ATOMIC_ACQUIRE);
    return bs == 2 ? __atomic_load_n(&blind_reason, __ATOMIC_RELAXED) : bs == 1 ? NULL : blind_env();
}
