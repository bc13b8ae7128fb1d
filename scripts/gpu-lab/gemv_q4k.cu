// What shape streams: vkllm's Q4_K integer-dot decode GEMV (glsl/mul_mat_vec.comp
// built with Q8X) ported to CUDA, beside kernels that only read the same bytes,
// timed on the device machine where nvcc and ncu exist and Vulkan shaders
// cannot be profiled. Measurement only: nothing here runs in vkllm.
//
//   nvcc -O3 -arch=sm_90 -o /tmp/gemv_q4k scripts/gpu-lab/gemv_q4k.cu && /tmp/gemv_q4k
//
// Same block layout (144-byte blocks: d, dmin, 12 scale bytes, 128 quant
// bytes), same lanes (a slot of 64 values per invocation, four slots per
// block, two rows per subgroup), x as two int8 digits per value in q8.glsl's
// run order with (d, Σ) per 32 values, packed 4 x int8 dots. The numbers
// are not checked against a reference: the kernels time loads and
// arithmetic, and write their sums only so nothing is optimized away.
// Weights rotate over copies past the L2 cache; each launch is timed with
// events (which add ~2 µs per launch), median of 200.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cuda_fp16.h>
#include <vector>

#define CK(x)                                                                 \
    do {                                                                      \
        cudaError_t e = (x);                                                  \
        if (e != cudaSuccess) {                                               \
            printf("CUDA %s at line %d\n", cudaGetErrorString(e), __LINE__); \
            exit(1);                                                          \
        }                                                                     \
    } while (0)

// mul_mat_vec.comp's k_sm2: (scale, min) of sub-blocks 2c and 2c + 1.
__device__ __forceinline__ float4 k_sm2(uint32_t sx, uint32_t sy, uint32_t sz, uint32_t c) {
    uint32_t sh = 16u * (c & 1u);
    uint32_t px = (sx >> sh) & 0xFFFFu, py = (sy >> sh) & 0xFFFFu, pz = (sz >> sh) & 0xFFFFu;
    uint32_t lox = px & 0x3F3Fu, loy = py & 0x3F3Fu;
    uint32_t hix = (pz & 0x0F0Fu) | ((px >> 2) & 0x3030u);
    uint32_t hiy = ((pz >> 4) & 0x0F0Fu) | ((py >> 2) & 0x3030u);
    uint32_t vx = c < 2u ? lox : hix, vy = c < 2u ? loy : hiy;
    return make_float4(vx & 0xFF, vy & 0xFF, vx >> 8, vy >> 8);
}

__device__ __forceinline__ uint32_t word(const uint4 &q, int w) {
    return w == 0 ? q.x : w == 1 ? q.y : w == 2 ? q.z : q.w;
}

enum Mode { FULL, ONE_DIGIT, WEIGHTS_ONLY };

// One slot s (64 values) of NR rows from row0: the GEMV's loop body.
template <Mode MODE, int NR, int K>
__device__ __forceinline__ void slot(int s, int row0, const uint4 *__restrict__ wq,
                                     const uint4 *__restrict__ xq4, const float *__restrict__ xqf,
                                     float (&acc)[NR], uint32_t &xr) {
    const int nb = K / 256;
    int blk = s >> 2, sub = s & 3;
    int col = blk * 256 + 64 * sub;
    uint4 xs[8];
    float4 sums = make_float4(0, 0, 0, 0);
    if (MODE != WEIGHTS_ONLY) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            xs[i] = xq4[i * (K / 64) + col / 64];
            if (MODE == FULL) xs[4 + i] = xq4[K / 16 + i * (K / 64) + col / 64];
        }
        const float *f = xqf + K / 2 + 2 * (col / 32);
        sums = make_float4(f[0], f[1], f[2], f[3]);
    }
#pragma unroll
    for (int j = 0; j < NR; j++) {
        size_t base = (size_t)(row0 + j) * nb * 9 + blk * 9;
        uint4 head = wq[base];
        uint4 qa = wq[base + 1 + 2 * sub], qb = wq[base + 2 + 2 * sub];
        if (MODE == WEIGHTS_ONLY) {
            xr ^= head.x ^ head.y ^ head.z ^ head.w ^ qa.x ^ qa.y ^ qa.z ^ qa.w ^ qb.x ^ qb.y ^ qb.z ^ qb.w;
            continue;
        }
        float2 dm = __half22float2(*reinterpret_cast<const __half2 *>(&head.x));
        float4 sm = k_sm2(head.y, head.z, head.w, sub);
        int hi0 = 0, lo0 = 0, hi1 = 0, lo1 = 0;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            uint4 q = h ? qb : qa;
#pragma unroll
            for (int w = 0; w < 4; w++) {
                int a = (int)(word(q, w) & 0x0F0F0F0Fu), b = (int)((word(q, w) >> 4) & 0x0F0F0F0Fu);
                hi0 = __dp4a(a, (int)word(xs[h], w), hi0);
                hi1 = __dp4a(b, (int)word(xs[2 + h], w), hi1);
                if (MODE == FULL) {
                    lo0 = __dp4a(a, (int)word(xs[4 + h], w), lo0);
                    lo1 = __dp4a(b, (int)word(xs[6 + h], w), lo1);
                }
            }
        }
        float d0 = float(hi0) + float(lo0) * (1.0f / 254.0f), d1 = float(hi1) + float(lo1) * (1.0f / 254.0f);
        acc[j] += dm.x * (sm.x * sums.x * d0 + sm.z * sums.z * d1) - dm.y * (sm.y * sums.y + sm.w * sums.w);
    }
}

// NR rows per row group, KS subgroups splitting k per row group, U slots per
// loop step (their loads issued together).
template <Mode MODE, int NR, int K, int KS, int U>
__global__ void gemv(const uint4 *__restrict__ wq, const uint4 *__restrict__ xq4,
                     const float *__restrict__ xqf, float *__restrict__ y, int n) {
    const int slots = K / 64;
    int lane = threadIdx.x & 31;
    int sg = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int g = sg % KS;
    int row0 = (sg / KS) * NR;
    if (row0 >= n) return;
    float acc[NR] = {};
    uint32_t xr = 0;
    int k_slots = slots; // a run-time bound, as the shader's loop
    asm volatile("" : "+r"(k_slots));
#pragma unroll 1
    for (int s0 = lane + 32 * g; s0 < k_slots; s0 += 32 * KS * U) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            int s = s0 + 32 * KS * u;
            if (s < k_slots) slot<MODE, NR, K>(s, row0, wq, xq4, xqf, acc, xr);
        }
    }
    __shared__ float part[32][NR];
#pragma unroll
    for (int j = 0; j < NR; j++) {
        float v = acc[j] + (float)(xr & 1u) * 1e-30f;
        for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (KS == 1 && lane == 0) y[row0 + j] = v;
        if (KS > 1 && lane == 0) part[threadIdx.x >> 5][j] = v;
    }
    if (KS > 1) {
        __syncthreads();
        if (g == 0 && lane < NR) {
            float v = 0.f;
            for (int w = 0; w < KS; w++) v += part[(threadIdx.x >> 5) + w][lane];
            y[row0 + lane] = v;
        }
    }
}

// Each row read as contiguous 16-byte pieces, two rows per subgroup (weights only).
template <int K>
__global__ void row_pieces(const uint4 *__restrict__ wq, float *__restrict__ y, int n) {
    const int per = K / 256 * 9;
    int lane = threadIdx.x & 31;
    int row0 = ((blockIdx.x * blockDim.x + threadIdx.x) >> 5) * 2;
    if (row0 >= n) return;
    uint32_t xr = 0;
#pragma unroll
    for (int j = 0; j < 2; j++)
#pragma unroll
        for (int i = lane; i < per; i += 32) {
            uint4 q = wq[(size_t)(row0 + j) * per + i];
            xr ^= q.x ^ q.y ^ q.z ^ q.w;
        }
    for (int o = 16; o; o >>= 1) xr ^= __shfl_xor_sync(0xffffffffu, xr, o);
    if (lane == 0) y[row0] = (float)xr;
}

// A grid-stride read of the same bytes.
__global__ void stream(const uint4 *__restrict__ wq, float *__restrict__ y, size_t n4) {
    uint32_t xr = 0;
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
        uint4 q = wq[i];
        xr ^= q.x ^ q.y ^ q.z ^ q.w;
    }
    if (xr == 0x12345678u) y[0] = 1.f;
}

template <typename F>
float median_us(F launch, int copies) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> t;
    for (int r = 0; r < 205; r++) {
        CK(cudaEventRecord(a));
        launch(r % copies);
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (r >= 5) t.push_back(ms * 1000.f);
    }
    CK(cudaGetLastError());
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

template <int K>
void shape(int n, int sms) {
    size_t bytes = (size_t)n * (K / 256) * 144;
    int copies = (int)std::max<size_t>(3, (size_t)(400u << 20) / bytes);
    std::vector<uint32_t> h(bytes / 4);
    uint32_t s = 12345;
    for (auto &v : h) v = s = s * 1664525u + 1013904223u;
    for (size_t blk = 0; blk < bytes / 144; blk++) h[blk * 36] = 0x1c001c00u; // finite d, dmin
    std::vector<uint4 *> w(copies);
    for (auto &p : w) {
        CK(cudaMalloc(&p, bytes));
        CK(cudaMemcpy(p, h.data(), bytes, cudaMemcpyHostToDevice));
    }
    std::vector<uint32_t> hx(K);
    for (auto &v : hx) v = (s = s * 1664525u + 1013904223u) & 0x7f7f7f7fu;
    std::vector<float> hf(K, 0.01f);
    uint4 *x;
    float *xf, *y;
    CK(cudaMalloc(&x, K * 4));
    CK(cudaMemcpy(x, hx.data(), K * 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&xf, K * 4));
    CK(cudaMemcpy(xf, hf.data(), K * 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&y, n * 4));
    auto row = [&](const char *name, float us) {
        printf("%-40s %6d x %-6d %8.2f us %7.0f GB/s\n", name, n, K, us, bytes / (us * 1e3));
    };
#define GEMV(name, MODE, NR, KS, U, WG)                                                            \
    row(name, median_us([&](int i) { gemv<MODE, NR, K, KS, U><<<n / NR * KS * 32 / WG, WG>>>(w[i], x, xf, y, n); }, copies))
    row("stream", median_us([&](int i) { stream<<<sms * 64, 256>>>(w[i], y, bytes / 16); }, copies));
    row("row pieces (weights only)", median_us([&](int i) { row_pieces<K><<<n / 4, 64>>>(w[i], y, n); }, copies));
    GEMV("gemv order (weights only)", WEIGHTS_ONLY, 2, 1, 1, 64);
    GEMV("gemv, hi digit only", ONE_DIGIT, 2, 1, 1, 64);
    GEMV("gemv as built (2 rows, 64 inv.)", FULL, 2, 1, 1, 64);
    GEMV("gemv, 128 invocations", FULL, 2, 1, 1, 128);
    GEMV("gemv, 256 invocations", FULL, 2, 1, 1, 256);
    GEMV("gemv, 2 slots per step", FULL, 2, 1, 2, 64);
    GEMV("gemv, 2 subgroups split k", FULL, 2, 2, 1, 64);
    GEMV("gemv, 4 subgroups split k", FULL, 2, 4, 1, 128);
    GEMV("gemv, 1 row per subgroup", FULL, 1, 1, 1, 64);
    GEMV("gemv, 4 rows per subgroup", FULL, 4, 1, 1, 64);
#undef GEMV
    for (auto p : w) CK(cudaFree(p));
    CK(cudaFree(x));
    CK(cudaFree(xf));
    CK(cudaFree(y));
}

int main() {
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    printf("%s, %d SMs, L2 %d MB\n", p.name, p.multiProcessorCount, p.l2CacheSize >> 20);
    shape<4096>(28672, p.multiProcessorCount); // Llama-3.1-8B gate + up
    shape<14336>(4096, p.multiProcessorCount); // its Q4_K down projection
    shape<4096>(4096, p.multiProcessorCount);  // its Q and o projections
    return 0;
}
