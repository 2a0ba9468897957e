/* cudart.h - the real CUDA runtime's functions, found at run time.
 *
 * libforgealloc.so has no DT_NEEDED on libcudart (a second copy would
 * replace the one the framework ships).  At the first CUDA call the shim
 * looks the functions up: in the libcudart that dlsym(RTLD_NEXT) finds, or,
 * when the framework loaded cudart with dlopen(RTLD_LOCAL) (Python
 * extensions: RTLD_NEXT then returns NULL), in the loaded libcudart*.so*
 * found through dl_iterate_phdr.  All functions come from one library. */
#ifndef FA_CUDART_H
#define FA_CUDART_H

#include <stdbool.h>

#include "cuda_abi.h"

typedef struct fa_cudart {
#define FA_CUDART_PTR(name, ret, params, args) ret(*name) params;
    FA_CUDART_FUNCS(FA_CUDART_PTR)
#undef FA_CUDART_PTR
    char path[512]; /* the library they come from; "" if none was found */
} fa_cudart;

/* The runtime's functions (members NULL when missing).  Never NULL. */
const fa_cudart *fa_cudart_get(void);
void fa_cudart_fork_child(void);

/* The driver's virtual-memory functions, from the runtime's
 * cudaGetDriverEntryPointByVersion (or cudaGetDriverEntryPoint): libcuda is
 * never linked or opened by name. */
typedef struct fa_cudrv {
#define FA_CUDRV_PTR(name, params) fa_cu_result(*name) params;
    FA_CU_FUNCS(FA_CUDRV_PTR)
#undef FA_CUDRV_PTR
} fa_cudrv;

/* The shim's own runtime calls must not change what the program reads
 * from cudaGetLastError / cudaPeekAtLastError.  Before an internal call
 * whose failure the shim handles itself: before = fa_cudart_error_peek(rt).
 * After it (failed or not): fa_cudart_error_restore(rt, before) leaves the
 * thread's last error as `before` again.  The runtime has no call that
 * sets the last error, so an earlier error of the program is raised again
 * by a call that fails with it and changes nothing: cudaErrorInvalidValue,
 * cudaErrorMemoryAllocation and cudaErrorInvalidDevice can be; for any
 * other code the internal call's error is left in its place (an error
 * stays pending, as the program had one).  A sticky error is the same
 * before and after, and is left alone. */
fa_cuda_error fa_cudart_error_peek(const fa_cudart *rt);
void fa_cudart_error_restore(const fa_cudart *rt, fa_cuda_error before);
/* Make e the thread's last error with a call that fails with e and has no
 * other effect (in relaxed capture mode: no capture is refused or
 * invalidated by it), where one is known: cudaErrorInvalidValue,
 * cudaErrorMemoryAllocation, cudaErrorInvalidDevice; else nothing. */
void fa_cudart_error_raise(const fa_cudart *rt, fa_cuda_error e);

/* The calling thread in relaxed capture mode, around a call the shim
 * makes on its own behalf: a potentially unsafe call (cudaMalloc,
 * cudaFree, cudaEventQuery, ...) made in relaxed mode is neither refused
 * for a stream capture under way nor invalidates it, whatever the
 * capture's mode and thread (so on an H200 with CUDA 13.0).  relax gives
 * the mode that unrelax puts back. */
typedef struct fa_cudart_mode {
    fa_cuda_capture_mode mode;
    bool changed;
} fa_cudart_mode;
fa_cudart_mode fa_cudart_relax(const fa_cudart *rt);
void fa_cudart_unrelax(const fa_cudart *rt, fa_cudart_mode m);

/* The definition of `name` that the dynamic linker finds after ours (the
 * driver's, for a driver function the program calls by name), or NULL. */
void *fa_cudart_next(const char *name);

/* Pre: rt has found a runtime.  Looked up once; NULL when any function is
 * missing (an old runtime or driver).  A failed lookup leaves the calling
 * thread's last error as it was. */
const fa_cudrv *fa_cudrv_get(const fa_cudart *rt);

#endif
