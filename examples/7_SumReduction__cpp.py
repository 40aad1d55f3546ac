# Honest: sum over one dimension (keepdim) as a C++ loop, built with load_inline (CPU only).
# A reduction written by hand: the input is viewed as (outer, reduced, inner) and each output
# element is accumulated in double, so the result matches PyTorch's fp32 sum closely.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <vector>

torch::Tensor sum_keepdim(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.device().is_cpu(), "sum_keepdim: expected a CPU tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "sum_keepdim: expected float32");
    auto input = x.contiguous();
    dim = dim < 0 ? dim + input.dim() : dim;
    TORCH_CHECK(dim >= 0 && dim < input.dim(), "sum_keepdim: dim out of range");

    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= input.size(d);
    for (int64_t d = dim + 1; d < input.dim(); ++d) inner *= input.size(d);
    const int64_t reduced = input.size(dim);

    auto out_sizes = input.sizes().vec();
    out_sizes[dim] = 1;
    auto out = torch::empty(out_sizes, input.options());

    const float* src = input.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    std::vector<double> acc(inner);
    for (int64_t o = 0; o < outer; ++o) {
        std::fill(acc.begin(), acc.end(), 0.0);
        // Walk the reduced dimension in the outer loop so the inner loop reads contiguous memory.
        for (int64_t r = 0; r < reduced; ++r) {
            const float* row = src + (o * reduced + r) * inner;
            for (int64_t i = 0; i < inner; ++i) acc[i] += row[i];
        }
        for (int64_t i = 0; i < inner; ++i) dst[o * inner + i] = static_cast<float>(acc[i]);
    }
    return out;
}
"""

sum_ext = load_inline(
    name="kbv_example_sum_cpp",
    cpp_sources=cpp_source,
    functions=["sum_keepdim"],
    extra_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum_ext.sum_keepdim(x, self.dim)
