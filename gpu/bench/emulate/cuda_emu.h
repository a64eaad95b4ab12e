// Just enough of CUDA to run gpu/src/cuda/logits.cu as C++ on the CPU: one
// std::thread per CUDA thread, a std::barrier for __syncthreads, per-warp
// barriers for the shuffles, one block at a time (so `static` is block
// shared memory). For checking the kernel's logic where no GPU is lent; it
// says nothing about speed, and nothing about races the hardware would show
// that these barriers hide.
#pragma once
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#define CUDA_EMULATION 1
#define __device__
#define __global__
#define __forceinline__ inline
#define __noinline__
#define __restrict__
#define __launch_bounds__(x)
#define __shared__ static

struct dim3_emu { unsigned x = 0, y = 0, z = 0; };
inline thread_local dim3_emu threadIdx, blockIdx;

struct float4 { float x, y, z, w; };
struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };

template <typename T> inline T __ldg(const T* p) { return *p; }
inline float __int_as_float(int v) { float f; std::memcpy(&f, &v, 4); return f; }
inline float __uint_as_float(unsigned v) { float f; std::memcpy(&f, &v, 4); return f; }
using std::isfinite;

namespace emu {
inline std::unique_ptr<std::barrier<>> block_barrier;
inline std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
inline uint32_t shfl_buf[1024];
}  // namespace emu

inline void __syncthreads() { emu::block_barrier->arrive_and_wait(); }

template <typename T> inline T __shfl_xor_sync(unsigned, T v, int mask) {
    static_assert(sizeof(T) == 4, "32-bit shuffles only");
    const unsigned t = threadIdx.x, warp = t >> 5, lane = t & 31;
    uint32_t bits; std::memcpy(&bits, &v, 4);
    emu::shfl_buf[t] = bits;
    emu::warp_barriers[warp]->arrive_and_wait();
    uint32_t got = emu::shfl_buf[warp * 32 + (lane ^ (unsigned)mask)];
    emu::warp_barriers[warp]->arrive_and_wait();
    T out; std::memcpy(&out, &got, 4);
    return out;
}

// Run `kernel` over `grid` blocks of `block` threads, one block at a time.
template <typename F> void launch(unsigned grid, unsigned block, F kernel) {
    for (unsigned b = 0; b < grid; ++b) {
        emu::block_barrier = std::make_unique<std::barrier<>>(block);
        emu::warp_barriers.clear();
        for (unsigned w = 0; w < (block + 31) / 32; ++w) emu::warp_barriers.push_back(std::make_unique<std::barrier<>>(32));
        std::vector<std::thread> threads;
        for (unsigned t = 0; t < block; ++t) {
            threads.emplace_back([=] { threadIdx.x = t; blockIdx.x = b; kernel(); });
        }
        for (auto& th : threads) th.join();
    }
}
