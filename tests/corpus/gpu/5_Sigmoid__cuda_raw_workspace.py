# kbv-fixture: expect=verified categories= standard=correct
# kbv-memory: device_raw_bytes>=67108864
# Honest, with memory PyTorch cannot see: the kernel stages its result through a 64 MiB scratch area
# allocated once with raw cudaMalloc (outside the caching allocator) and then copies it out. The
# values are right; the device-level memory figure must show the hidden 64 MiB.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime.h>

static float* scratch = nullptr;
static const size_t SCRATCH_BYTES = size_t(64) << 20;

__global__ void sigmoid_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        y[i] = 1.0f / (1.0f + expf(-x[i]));
    }
}

torch::Tensor sigmoid_staged(torch::Tensor x) {
    if (scratch == nullptr) {
        TORCH_CHECK(cudaMalloc(&scratch, SCRATCH_BYTES) == cudaSuccess, "cudaMalloc failed");
    }
    torch::Tensor src = x.contiguous();
    torch::Tensor dst = torch::empty_like(src);
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const int64_t n = src.numel();
    const int64_t chunk = (int64_t)(SCRATCH_BYTES / sizeof(float));
    for (int64_t start = 0; start < n; start += chunk) {
        const int64_t len = std::min(chunk, n - start);
        const int blocks = (int)std::min<int64_t>((len + 255) / 256, 65535);
        sigmoid_kernel<<<blocks, 256, 0, stream>>>(src.data_ptr<float>() + start, scratch, len);
        cudaMemcpyAsync(dst.data_ptr<float>() + start, scratch, len * sizeof(float), cudaMemcpyDeviceToDevice, stream);
    }
    return dst;
}
"""

CPP_DECL = "torch::Tensor sigmoid_staged(torch::Tensor x);"

ext = load_inline(name="kbv_corpus_sigmoid_raw_scratch", cpp_sources=CPP_DECL, cuda_sources=CUDA_SOURCE,
                  functions=["sigmoid_staged"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.sigmoid_staged(x)
