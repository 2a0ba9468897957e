/* d_rtld.c - a program that does not link libcudart loads a "framework"
 * with dlopen(RTLD_LOCAL), as Python loads torch; the framework's
 * cudaMalloc must still reach the pool (dlsym(RTLD_NEXT) cannot find the
 * runtime in that case, the shim finds it among the loaded objects). */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>

int main(void)
{
    void *fw = dlopen(FAKEFRAMEWORK_PATH, RTLD_NOW | RTLD_LOCAL);
    if (!fw) {
        fprintf(stderr, "d_rtld: %s\n", dlerror());
        return 1;
    }
    int (*fw_malloc)(void **, size_t) = (int (*)(void **, size_t))dlsym(fw, "fw_malloc");
    int (*fw_free)(void *) = (int (*)(void *))dlsym(fw, "fw_free");
    int (*stat)(const char *, uint64_t *) = (int (*)(const char *, uint64_t *))dlsym(RTLD_DEFAULT, "forgealloc_stat");
    void *p = NULL;
    uint64_t pooled = 0;
    int ok = fw_malloc && fw_free && stat && fw_malloc(&p, 1 << 20) == 0 && p &&
             stat("device.0.pool_allocs", &pooled) == 0 && pooled == 1 && fw_free(p) == 0;
    if (!ok)
        fprintf(stderr, "d_rtld: the framework's cudaMalloc did not reach the pool (pool_allocs=%llu)\n",
                (unsigned long long)pooled);
    return ok ? 0 : 1;
}
