# C1 under a kernel's name: the extension defines kernels named like cuBLAS's and never launches
# them; its function hands the product to ATen (cuBLAS). A profile matched by name credits cuBLAS's
# kernels to the candidate; by provenance nothing of its own ran: no_custom_kernel.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SOURCE = r"""
#include <torch/extension.h>

extern "C" __global__ void gemm(float* c) { c[threadIdx.x] = 0.0f; }
__global__ void cublas_sgemm_decoy(float* c, int n) { if (threadIdx.x < n) c[threadIdx.x] = 0.0f; }

torch::Tensor matmul(torch::Tensor a, torch::Tensor b) {
    return torch::mm(a.contiguous(), b.contiguous());  // "fast path"
}
"""

ext = load_inline(name="kbv_gpu_attribution_decoy_unlaunched",
                  cpp_sources="torch::Tensor matmul(torch::Tensor a, torch::Tensor b);",
                  cuda_sources=CUDA_SOURCE, functions=["matmul"], verbose=False)


class ModelNew(nn.Module):
    def forward(self, a, b):
        return ext.matmul(a, b)
