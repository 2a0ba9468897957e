/* ctorlib.c - libfactor.so: a library whose constructor calls cudaMalloc,
 * as CUDA extensions do when they set up at load.  The constructor runs
 * inside dlopen, with the loader's lock held; d_loader has another thread
 * make its first CUDA call at that moment. */
#include <time.h>

#include "fakecuda.h"

/* Set by d_loader (found with dlsym in the main program). */
extern void d_loader_ctor_started(void) __attribute__((weak));
int ctorlib_result = -1;

__attribute__((constructor)) static void setup(void)
{
    if (d_loader_ctor_started)
        d_loader_ctor_started(); /* the other thread calls cudaMalloc now */
    struct timespec ts = {0, 300 * 1000000L};
    nanosleep(&ts, NULL); /* it reaches the loader's lock before we go on */
    void *p = NULL;
    ctorlib_result = cudaMalloc(&p, 1 << 20);
    if (ctorlib_result == 0)
        ctorlib_result = cudaFree(p);
}

FAKECUDA_API int ctorlib_status(void) { return ctorlib_result; }
