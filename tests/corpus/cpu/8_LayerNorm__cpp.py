# kbv-fixture: expect=verified categories= standard=correct
# Honest: LayerNorm over the last dimension as a C++ CPU kernel: one row per task, mean and variance
# accumulated in double over two passes, then the affine transform.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>

torch::Tensor layer_norm_rows(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double eps) {
    TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32,
                "layer_norm_rows: float32 CPU tensor expected");
    torch::Tensor src = x.contiguous();
    torch::Tensor w = weight.contiguous();
    torch::Tensor b = bias.contiguous();
    const int64_t features = w.numel();
    const int64_t rows = src.numel() / features;
    torch::Tensor dst = torch::empty_like(src);
    const float* in = src.data_ptr<float>();
    const float* pw = w.data_ptr<float>();
    const float* pb = b.data_ptr<float>();
    float* out = dst.data_ptr<float>();
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
            const float* row = in + r * features;
            double sum = 0.0;
            for (int64_t j = 0; j < features; ++j) sum += row[j];
            const double mean = sum / features;
            double sq = 0.0;
            for (int64_t j = 0; j < features; ++j) {
                const double d = row[j] - mean;
                sq += d * d;
            }
            const double rstd = 1.0 / std::sqrt(sq / features + eps);
            float* orow = out + r * features;
            for (int64_t j = 0; j < features; ++j) {
                orow[j] = static_cast<float>((row[j] - mean) * rstd) * pw[j] + pb[j];
            }
        }
    });
    return dst;
}
"""

ln_ext = load_inline(name="kbv_corpus_layer_norm_cpu", cpp_sources=CPP_SOURCE, functions=["layer_norm_rows"],
                     extra_cflags=["-O2"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.ln = nn.LayerNorm(features)  # holds weight and bias (same names as the reference's)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ln_ext.layer_norm_rows(x, self.ln.weight, self.ln.bias, self.ln.eps)
