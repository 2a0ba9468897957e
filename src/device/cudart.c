/* cudart.c - find the real CUDA runtime (see cudart.h). */
#define _GNU_SOURCE
#include "cudart.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <string.h>

#include "../core/log.h"

static fa_cudart rt;
static int found; /* 1 once a runtime was found; until then every call looks again */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* dl_iterate_phdr callback: the first loaded libcudart*.so* that is not us. */
static int find_loaded(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    const char *name = info->dlpi_name;
    const char *base = name ? strrchr(name, '/') : NULL;
    base = base ? base + 1 : name;
    if (!base || strncmp(base, "libcudart", 9) != 0 || !strstr(base, ".so"))
        return 0;
    size_t n = strlen(name);
    if (n >= sizeof rt.path)
        return 0;
    memcpy(data, name, n + 1);
    return 1;
}

static void resolve(void)
{
    rt.path[0] = '\0';
    /* Where does the next cudaMalloc after ours live? */
    void *next = dlsym(RTLD_NEXT, "cudaMalloc");
    Dl_info info;
    if (next && dladdr(next, &info) && info.dli_fname && strlen(info.dli_fname) < sizeof rt.path)
        strcpy(rt.path, info.dli_fname);
    else
        dl_iterate_phdr(find_loaded, rt.path); /* loaded with RTLD_LOCAL */
    if (!rt.path[0])
        return;
    /* RTLD_NOLOAD: only a library that is already there; never load one. */
    void *h = dlopen(rt.path, RTLD_LAZY | RTLD_NOLOAD);
    if (!h) {
        rt.path[0] = '\0';
        return;
    }
#define FA_CUDART_LOOKUP(name, ret, params, args) *(void **)&rt.name = dlsym(h, #name);
    FA_CUDART_FUNCS(FA_CUDART_LOOKUP)
#undef FA_CUDART_LOOKUP
    /* The handle stays open: the runtime must outlive our use of it. */
    fa_debug("CUDA runtime functions from %s", rt.path);
    __atomic_store_n(&found, 1, __ATOMIC_RELEASE);
}

const fa_cudart *fa_cudart_get(void)
{
    if (!__atomic_load_n(&found, __ATOMIC_ACQUIRE)) {
        pthread_mutex_lock(&lock);
        if (!found)
            resolve();
        pthread_mutex_unlock(&lock);
    }
    return &rt;
}
