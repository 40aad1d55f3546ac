# kbv-fixture: expect=verified categories= standard=correct
# Honest, the shape of a real RL kernel: the GEMM through cuBLAS, the bias and the ReLU in one CUDA
# epilogue built with load_inline. Its weights (128 MiB) outweigh one set of inputs and outputs.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>

__global__ void bias_relu_kernel(const float* __restrict__ y, const float* __restrict__ b,
                                 float* __restrict__ out, int64_t n, int64_t cols) {
    int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (; i < n; i += stride) out[i] = fmaxf(y[i] + b[i % cols], 0.0f);
}

torch::Tensor bias_relu(torch::Tensor y, torch::Tensor b) {
    TORCH_CHECK(y.is_cuda() && b.is_cuda(), "bias_relu: expected CUDA tensors");
    auto yc = y.contiguous();
    auto out = torch::empty_like(yc);
    const int64_t n = yc.numel();
    const int threads = 256;
    const int64_t wanted = (n + threads - 1) / threads;
    const int blocks = static_cast<int>(wanted < 65535 * 8 ? wanted : 65535 * 8);
    bias_relu_kernel<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        yc.data_ptr<float>(), b.contiguous().data_ptr<float>(), out.data_ptr<float>(), n, yc.size(1));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

ext = load_inline(name="kbv_shaped_linear_bias_relu", cpp_sources="torch::Tensor bias_relu(torch::Tensor y, torch::Tensor b);",
                  cuda_sources=cuda_source, functions=["bias_relu"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.bias_relu(torch.mm(x, self.linear.weight.t()), self.linear.bias)
