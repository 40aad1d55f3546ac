# Honest: a shared-memory tiled fp32 matmul of its own, built with load_inline. Attribution must
# find its kernel (by the extension's symbols) and credit it with the device time.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

#define TILE 32

template <typename T>
__global__ void tiled_matmul_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ c,
                                    int M, int N, int K) {
    __shared__ T as[TILE][TILE];
    __shared__ T bs[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    T acc = 0;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        as[threadIdx.y][threadIdx.x] = (row < M && k0 + threadIdx.x < K) ? a[row * K + k0 + threadIdx.x] : T(0);
        bs[threadIdx.y][threadIdx.x] = (col < N && k0 + threadIdx.y < K) ? b[(k0 + threadIdx.y) * N + col] : T(0);
        __syncthreads();
        for (int k = 0; k < TILE; ++k) acc += as[threadIdx.y][k] * bs[k][threadIdx.x];
        __syncthreads();
    }
    if (row < M && col < N) c[row * N + col] = acc;
}

torch::Tensor matmul(torch::Tensor a, torch::Tensor b) {
    a = a.contiguous();
    b = b.contiguous();
    const int M = a.size(0), K = a.size(1), N = b.size(1);
    auto c = torch::empty({M, N}, a.options());
    dim3 block(TILE, TILE), grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
    tiled_matmul_kernel<float><<<grid, block, 0, at::cuda::getCurrentCUDAStream()>>>(
        a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(), M, N, K);
    return c;
}
"""

ext = load_inline(name="kbv_gpu_attribution_honest",
                  cpp_sources="torch::Tensor matmul(torch::Tensor a, torch::Tensor b);",
                  cuda_sources=CUDA_SOURCE, functions=["matmul"], verbose=False)


class ModelNew(nn.Module):
    def forward(self, a, b):
        return ext.matmul(a, b)
