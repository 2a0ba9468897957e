// gpu_bench.cu - device allocation workloads for tests/bench/gpu.py, on a
// real GPU.  Built by nvcc with -cudart shared, so a preloaded forgealloc
// sees its cudaMalloc calls.  Prints one JSON object on its last line.
//
//   gpu_bench pairs N BUSY_MS SIZE[,SIZE...]   cudaMalloc+cudaFree pair cost by size; with BUSY_MS > 0 a
//                                             kernel of that length is queued on another stream first
//   gpu_bench threads T ITERS MAX_BYTES       T threads each allocating, writing, checking, freeing
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>

static double now_us()
{
    using namespace std::chrono;
    return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

__global__ void spin(unsigned long long ns)
{
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        __nanosleep(20000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}

static void die(const char *what, cudaError_t r)
{
    fprintf(stderr, "gpu_bench: %s: %s\n", what, cudaGetErrorString(r));
    exit(1);
}

static int pairs(long n, double busy_ms, const char *list)
{
    std::vector<size_t> sizes;
    for (const char *p = list; *p;) {
        sizes.push_back(strtoull(p, (char **)&p, 0));
        if (*p == ',')
            p++;
    }
    cudaStream_t other;
    cudaError_t r = cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking);
    if (r)
        die("stream", r);
    cudaFree(nullptr);
    printf("{\"busy_ms\": %g, \"pairs\": %ld", busy_ms, n);
    for (size_t size : sizes) {
        std::vector<double> us;
        us.reserve(n);
        void *warm;
        if ((r = cudaMalloc(&warm, size)) || (r = cudaFree(warm)))
            die("warm-up", r);
        for (long i = 0; i < n; i++) {
            if (busy_ms > 0)
                spin<<<1, 1, 0, other>>>((unsigned long long)(busy_ms * 1e6));
            void *p;
            double t0 = now_us();
            if ((r = cudaMalloc(&p, size)))
                die("cudaMalloc", r);
            if ((r = cudaFree(p)))
                die("cudaFree", r);
            us.push_back(now_us() - t0);
        }
        cudaDeviceSynchronize();
        std::sort(us.begin(), us.end());
        printf(", \"us_%zu\": %.3f, \"p90_us_%zu\": %.3f", size, us[us.size() / 2], size, us[us.size() * 9 / 10]);
    }
    printf("}\n");
    return 0;
}

static int threads(int nt, long iters, size_t max)
{
    std::vector<std::thread> th;
    std::vector<long> bad(nt, 0);
    double t0 = now_us();
    for (int t = 0; t < nt; t++)
        th.emplace_back([t, iters, max, &bad] {
            cudaStream_t s;
            cudaStreamCreate(&s);
            unsigned seed = 12345u + 7919u * t;
            for (long i = 0; i < iters; i++) {
                seed = seed * 1103515245u + 12345u;
                size_t n = 512 + (seed >> 4) % max;
                void *p;
                cudaError_t r = cudaMalloc(&p, n);
                if (r)
                    die("cudaMalloc", r);
                int byte = (int)((i + t) & 0xff), got[2] = {0, 0};
                cudaMemsetAsync(p, byte, n, s);
                cudaMemcpyAsync(got, (char *)p + n - sizeof got, sizeof got, cudaMemcpyDeviceToHost, s);
                cudaStreamSynchronize(s);
                int want;
                memset(&want, byte, sizeof want);
                bad[t] += got[0] != want || got[1] != want;
                cudaFree(p);
            }
            cudaStreamDestroy(s);
        });
    for (auto &x : th)
        x.join();
    long b = 0;
    for (long x : bad)
        b += x;
    printf("{\"threads\": %d, \"iters\": %ld, \"s\": %.4f, \"bad\": %ld}\n", nt, iters, (now_us() - t0) * 1e-6, b);
    return b ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc == 5 && !strcmp(argv[1], "pairs"))
        return pairs(atol(argv[2]), atof(argv[3]), argv[4]);
    if (argc == 5 && !strcmp(argv[1], "threads"))
        return threads(atoi(argv[2]), atol(argv[3]), strtoull(argv[4], nullptr, 0));
    fprintf(stderr, "usage: gpu_bench pairs N BUSY_MS SIZE[,SIZE...] | threads T ITERS MAX_BYTES\n");
    return 2;
}
