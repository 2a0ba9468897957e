/* d_fork.c - fork while another thread allocates device memory.
 *
 * The runtime arrives by dlopen after the shim (as Python loads torch), so
 * its fork handler runs first and holds the runtime's lock across fork,
 * while the other thread may be inside the shim calling the runtime (a
 * pool growing).  Every fork must complete, and every child must be able to
 * use the allocator and exit.  A deadlock ends in SIGALRM. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)

static int (*fw_malloc)(void **, size_t);
static int (*fw_free)(void *);
static int (*fw_sync)(void);
static volatile int stop;
static long iters;

static void *worker(void *arg)
{
    (void)arg;
    for (unsigned k = 0; !stop; k++) {
        /* beyond a chunk, within one, and small: every way the pool grows */
        size_t n = k % 3 == 0 ? (64 + 2 * (k % 32)) * MIB : k % 3 == 1 ? (1 + k % 20) * MIB : 512 + k % 4096;
        void *p;
        if (fw_malloc(&p, n) == 0)
            fw_free(p);
        if (k % 8 == 0)
            fw_sync();
        __atomic_add_fetch(&iters, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int forks = argc > 1 ? atoi(argv[1]) : 200;
    void *fw = dlopen(FAKEFRAMEWORK_PATH, RTLD_NOW | RTLD_LOCAL);
    if (!fw) {
        fprintf(stderr, "d_fork: %s\n", dlerror());
        return 1;
    }
    fw_malloc = (int (*)(void **, size_t))dlsym(fw, "fw_malloc");
    fw_free = (int (*)(void *))dlsym(fw, "fw_free");
    fw_sync = (int (*)(void))dlsym(fw, "fw_sync");
    void *p;
    if (fw_malloc(&p, MIB) || fw_free(p)) {
        fprintf(stderr, "d_fork: the first cudaMalloc failed\n");
        return 1;
    }
    alarm(60); /* a deadlock fails instead of hanging */
    pthread_t t;
    pthread_create(&t, NULL, worker, NULL);
    for (int i = 0; i < forks; i++) {
        pid_t c = fork();
        if (c < 0) {
            perror("d_fork: fork");
            return 1;
        }
        if (c == 0) {
            alarm(10);
            /* CUDA cannot be used across fork: the call fails, and the
             * shim's state in the child is its own. */
            void *q = NULL;
            int rc = fw_malloc(&q, MIB);
            char *h = malloc(100);
            free(h);
            _exit(rc != 0 && h ? 0 : 2);
        }
        int st;
        waitpid(c, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "d_fork: child %d: %s %d\n", i, WIFEXITED(st) ? "exit" : "signal",
                    WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
            return 1;
        }
    }
    stop = 1;
    pthread_join(t, NULL);
    printf("forks %d worker_iters %ld\n", forks, iters);
    return 0;
}
