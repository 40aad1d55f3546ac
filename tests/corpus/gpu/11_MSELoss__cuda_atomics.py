# kbv-fixture: expect=verified categories= standard=correct
# Honest, atomics on the GPU: a grid-stride loop of squared differences, a shared-memory tree per
# block, and one atomicAdd per block into a float accumulator (order of additions not reproducible).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void mse_kernel(const float* __restrict__ p, const float* __restrict__ t, float* __restrict__ out,
                           int64_t n, float inv_n) {
    __shared__ float partial[256];
    float acc = 0.0f;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float d = p[i] - t[i];
        acc += d * d;
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicAdd(out, partial[0] * inv_n);
}

torch::Tensor mse_atomic(torch::Tensor p, torch::Tensor t) {
    torch::Tensor ps = p.contiguous(), ts = t.contiguous();
    torch::Tensor out = torch::zeros({}, ps.options());
    const int64_t n = ps.numel();
    const int blocks = (int)std::min<int64_t>((n + 255) / 256, 1024);
    mse_kernel<<<blocks, 256, 0, at::cuda::getCurrentCUDAStream()>>>(ps.data_ptr<float>(), ts.data_ptr<float>(),
                                                                      out.data_ptr<float>(), n, 1.0f / (float)n);
    return out;
}
"""

CPP_DECL = "torch::Tensor mse_atomic(torch::Tensor p, torch::Tensor t);"

ext = load_inline(name="kbv_corpus_mse_atomic", cpp_sources=CPP_DECL, cuda_sources=CUDA_SOURCE,
                  functions=["mse_atomic"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return ext.mse_atomic(predictions, targets)
