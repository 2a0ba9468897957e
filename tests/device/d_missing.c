/* d_missing.c - cudaMalloc reached without any CUDA runtime loaded (a
 * program probing for CUDA by symbol): the shim answers
 * cudaErrorInitializationError with one line, and does not crash. */
#include <dlfcn.h>
#include <stdio.h>

int main(void)
{
    int (*m)(void **, size_t) = (int (*)(void **, size_t))dlsym(RTLD_DEFAULT, "cudaMalloc");
    int (*f)(void *) = (int (*)(void *))dlsym(RTLD_DEFAULT, "cudaFree");
    void *p = NULL;
    if (!m || !f)
        return 2; /* the shim is not preloaded */
    int a = m(&p, 100), b = m(&p, 100), c = f(p);
    printf("%d %d %d\n", a, b, c);
    return a == 3 && b == 3 && c == 3 ? 0 : 1;
}
