/* d_loader.c - a CUDA call inside a library constructor (loader lock held)
 * while another thread makes the process's first CUDA call: neither may
 * wait on the other.  The shim looks for the runtime with dlsym and
 * dl_iterate_phdr, which take the loader's lock; holding a lock of its own
 * around that lookup would deadlock here.  The program links no cudart: the
 * runtime arrives with the library (as torch brings it to Python). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t c = PTHREAD_COND_INITIALIZER;
static int go;
static int (*shim_malloc)(void **, size_t);
static int (*shim_free)(void *);
static int thread_result = -1;

__attribute__((visibility("default"))) void d_loader_ctor_started(void)
{
    pthread_mutex_lock(&m);
    go = 1;
    pthread_cond_signal(&c);
    pthread_mutex_unlock(&m);
}

static void *first_call(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&m);
    while (!go)
        pthread_cond_wait(&c, &m);
    pthread_mutex_unlock(&m);
    void *p = NULL;
    thread_result = shim_malloc(&p, 1 << 20);
    if (thread_result == 0)
        thread_result = shim_free(p);
    return NULL;
}

int main(void)
{
    /* The preloaded shim's entry points, looked up before any CUDA call. */
    *(void **)&shim_malloc = dlsym(RTLD_DEFAULT, "cudaMalloc");
    *(void **)&shim_free = dlsym(RTLD_DEFAULT, "cudaFree");
    if (!shim_malloc || !shim_free) {
        fprintf(stderr, "d_loader: no cudaMalloc in the process (is the shim preloaded?)\n");
        return 1;
    }
    pthread_t t;
    pthread_create(&t, NULL, first_call, NULL);
    void *lib = dlopen(CTORLIB_PATH, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "d_loader: %s\n", dlerror());
        return 1;
    }
    pthread_join(t, NULL);
    int (*status)(void) = (int (*)(void))dlsym(lib, "ctorlib_status");
    int ctor = status ? status() : -2;
    printf("%d %d\n", ctor, thread_result);
    return ctor == 0 && thread_result == 0 ? 0 : 1;
}
