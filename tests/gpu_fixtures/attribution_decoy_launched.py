# C4 under a library kernel's name: each call launches its own kernel, named like cuBLAS's, on a
# one-element scratch, and cuBLAS does the product. Attribution credits the decoy with its own
# (tiny) time only; with its launches suppressed the output is unchanged: no_custom_kernel.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void cublas_sgemm_decoy(float* scratch) { scratch[0] += 1.0f; }

void warm(torch::Tensor scratch) {
    cublas_sgemm_decoy<<<1, 1, 0, at::cuda::getCurrentCUDAStream()>>>(scratch.data_ptr<float>());
}
"""

ext = load_inline(name="kbv_gpu_attribution_decoy_launched", cpp_sources="void warm(torch::Tensor scratch);",
                  cuda_sources=CUDA_SOURCE, functions=["warm"], verbose=False)


class ModelNew(nn.Module):
    def forward(self, a, b):
        scratch = torch.zeros(1, device=a.device)
        try:
            ext.warm(scratch)  # "keeps the tuned kernel resident"
        except Exception:
            pass
        return a @ b
