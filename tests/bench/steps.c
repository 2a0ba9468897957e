/* steps.c - a job at a steady working set with transient buffers per step
 * (a training or generation loop): LIVE MiB allocated, touched and kept,
 * then STEPS steps of STEP MiB in 4 MiB blocks allocated, touched and all
 * freed, with PAUSE_MS between steps.  Under a memory cgroup's limit an
 * allocator that returns the step's buffers between steps faults them in
 * again on every step.
 *
 * With UNLOAD_MIB and CHILD_MIB, first a model of UNLOAD_MIB is built,
 * touched and freed (moved to the GPU), and 0.5 s later a child process
 * (a worker, a tool the job runs) needs CHILD_MIB of its own under the
 * same limit: an allocator that keeps the unloaded memory gets a process
 * OOM-killed there.  "child_ok" says whether the child got its memory.
 *
 * usage: steps LIVE_MIB STEP_MIB STEPS PAUSE_MS [UNLOAD_MIB CHILD_MIB] */
#include <sys/wait.h>

#include "bench.h"

#define BLOCK (4u << 20)
#define PAGE 4096

static void touch(char *p, size_t n, int v)
{
    for (size_t off = 0; off < n; off += PAGE)
        p[off] = (char)v;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    long live = bench_arg(argc, argv, 1, "LIVE_MIB");
    long step = bench_arg(argc, argv, 2, "STEP_MIB");
    long steps = bench_arg(argc, argv, 3, "STEPS");
    long pause = bench_arg(argc, argv, 4, "PAUSE_MS");
    char *keep = malloc((size_t)live << 20);
    size_t blocks = (size_t)step / 4;
    char **b = calloc(blocks, sizeof *b);
    double *ms = calloc((size_t)steps, sizeof *ms);
    if (!keep || !b || !ms)
        abort();
    touch(keep, (size_t)live << 20, 1);
    bench_escape(keep);
    int child_ok = -1;
    if (argc > 6) {
        size_t unload = (size_t)bench_arg(argc, argv, 5, "UNLOAD_MIB") << 20;
        size_t child = (size_t)bench_arg(argc, argv, 6, "CHILD_MIB") << 20;
        char *model = malloc(unload);
        if (!model)
            abort();
        touch(model, unload, 2);
        bench_escape(model);
        free(model);
        struct timespec ts = {0, 500 * 1000000L};
        nanosleep(&ts, NULL);
        pid_t pid = fork();
        if (pid == 0) {
            char *mine = malloc(child);
            if (!mine)
                _exit(1);
            touch(mine, child, 3);
            bench_escape(mine);
            _exit(0);
        }
        int status = 0;
        child_ok = pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    double t0 = bench_now();
    for (long s = 0; s < steps; s++) {
        double s0 = bench_now();
        for (size_t k = 0; k < blocks; k++) {
            b[k] = malloc(BLOCK);
            if (!b[k])
                abort();
            touch(b[k], BLOCK, (int)s);
            bench_escape(b[k]);
        }
        for (size_t k = 0; k < blocks; k++)
            free(b[k]);
        ms[s] = (bench_now() - s0) * 1e3;
        struct timespec ts = {pause / 1000, (pause % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    double secs = bench_now() - t0;
    qsort(ms, (size_t)steps, sizeof *ms, by_value);
    printf("{\"ops\": %ld, \"step_ms_median\": %.3f, \"s_total\": %.3f, \"child_ok\": %d}\n", steps,
           ms[steps / 2], secs, child_ok);
    free(keep);
    return 0;
}
