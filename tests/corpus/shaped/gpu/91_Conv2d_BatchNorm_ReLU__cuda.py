# kbv-fixture: expect=verified categories= standard=correct
# Honest, the shape of a real RL kernel for conv + BatchNorm: the convolution through cuDNN, the
# batch's statistics through the library, the running mean and variance updated in place as
# PyTorch's training mode does, and the normalisation, affine and ReLU in one CUDA kernel.
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>

__global__ void bn_relu_kernel(const float* __restrict__ y, const float* __restrict__ scale,
                               const float* __restrict__ shift, float* __restrict__ out,
                               int64_t n, int64_t plane, int64_t channels) {
    int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (; i < n; i += stride) {
        const int64_t c = (i / plane) % channels;
        out[i] = fmaxf(y[i] * scale[c] + shift[c], 0.0f);
    }
}

torch::Tensor bn_relu(torch::Tensor y, torch::Tensor scale, torch::Tensor shift) {
    auto yc = y.contiguous();
    auto out = torch::empty_like(yc);
    const int64_t n = yc.numel();
    const int threads = 256;
    const int64_t wanted = (n + threads - 1) / threads;
    const int blocks = static_cast<int>(wanted < 65535 * 8 ? wanted : 65535 * 8);
    bn_relu_kernel<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        yc.data_ptr<float>(), scale.contiguous().data_ptr<float>(), shift.contiguous().data_ptr<float>(),
        out.data_ptr<float>(), n, yc.size(2) * yc.size(3), yc.size(1));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

ext = load_inline(name="kbv_shaped_bn_relu",
                  cpp_sources="torch::Tensor bn_relu(torch::Tensor y, torch::Tensor scale, torch::Tensor shift);",
                  cuda_sources=cuda_source, functions=["bn_relu"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)
        self.bn = nn.BatchNorm2d(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.conv2d(x, self.conv.weight, self.conv.bias, padding=self.conv.padding)
        bn = self.bn
        var, mean = torch.var_mean(y, dim=(0, 2, 3), unbiased=False)
        if self.training:  # the running statistics, as nn.BatchNorm2d keeps them (unbiased variance)
            count = y.numel() // y.shape[1]
            with torch.no_grad():
                bn.running_mean.mul_(1 - bn.momentum).add_(mean, alpha=bn.momentum)
                bn.running_var.mul_(1 - bn.momentum).add_(var * count / (count - 1), alpha=bn.momentum)
                bn.num_batches_tracked.add_(1)
        else:
            var, mean = bn.running_var, bn.running_mean
        scale = bn.weight * torch.rsqrt(var + bn.eps)
        return ext.bn_relu(y, scale, bn.bias - mean * scale)
