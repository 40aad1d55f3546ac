"""Honest candidates for the bundled suite, made from templates, each unique (a salt in its source),
so that no build cache can ever hit: what a cold run of fresh samples looks like. Used by
`bench/cold.py` and `bench/builds.py`.

Kinds (and the problems each solves):
- `cuda_elementwise`: load_inline CUDA, one grid-stride kernel (ReLU, LeakyReLU, Sigmoid, GELU);
- `cuda_reduction`: load_inline CUDA, a thread per output, accumulating in double (sum) or exactly (max);
- `cuda_softmax`: load_inline CUDA, a block per row with shared-memory reductions;
- `cuda_matmul`: load_inline CUDA, a shared-memory tiled fp32 matmul;
- `triton`: a Triton elementwise kernel (ReLU, LeakyReLU, Sigmoid);
- `torch`: PyTorch operations other than the reference's own (ReLU, Sigmoid, sum, softmax);
- `cpp`: load_inline C++ loops for the CPU (ReLU, LeakyReLU, Sigmoid, sum), built with -O3.

The CUDA sources are written as KernelBench's candidates are: `#include <torch/extension.h>` in the
kernels' file, bindings declared in `cpp_sources`, the candidate's own flags (none).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from string import Template

HEAD = "# cold: kind=$kind salt=$salt (a template of bench/templates.py, unique by its salt)\n"

CUDA_ELEMENTWISE = Template(HEAD + r'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

static constexpr int kSalt = $salt;

__global__ void op_kernel(const float* __restrict__ x, float* __restrict__ out, int64_t n, float alpha) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        const float v = x[i];
        out[i] = $expr;
    }
}

torch::Tensor op_forward(torch::Tensor x, double alpha) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "op_forward: a float32 CUDA tensor");
    auto input = x.contiguous();
    auto out = torch::empty_like(input);
    const int64_t n = input.numel();
    if (n == 0) return out;
    const int threads = 256;
    const int64_t wanted = (n + threads - 1) / threads;
    const int blocks = (int)(wanted < 65535 * 8 ? wanted : 65535 * 8);
    op_kernel<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        input.data_ptr<float>(), out.data_ptr<float>(), n, (float)alpha);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

ext = load_inline(name="cold_ew_$salt", cpp_sources="torch::Tensor op_forward(torch::Tensor x, double alpha);",
                  cuda_sources=cuda_source, functions=["op_forward"], verbose=False)


class ModelNew(nn.Module):
    def __init__($init):
        super().__init__()
        self.alpha = $alpha

    def forward(self, x):
        return ext.op_forward(x, self.alpha)
''')

CUDA_REDUCTION = Template(HEAD + r'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>
#include <vector>

static constexpr int kSalt = $salt;

// One thread per output element; the reduced dimension is walked with stride `inner`, so that
// neighbouring threads read neighbouring addresses.
__global__ void reduce_kernel(const float* __restrict__ x, float* __restrict__ out, int64_t outer,
                              int64_t reduced, int64_t inner) {
    const int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (idx >= outer * inner) return;
    const float* p = x + (idx / inner) * reduced * inner + idx % inner;
    $acc_type acc = $init;
    for (int64_t r = 0; r < reduced; ++r) {
        const float v = p[r * inner];
        acc = $combine;
    }
    out[idx] = (float)acc;
}

torch::Tensor reduce_forward(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "reduce_forward: a float32 CUDA tensor");
    auto input = x.contiguous();
    dim = dim < 0 ? dim + input.dim() : dim;
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= input.size(d);
    for (int64_t d = dim + 1; d < input.dim(); ++d) inner *= input.size(d);
    std::vector<int64_t> sizes = input.sizes().vec();
    if ($keepdim) sizes[dim] = 1; else sizes.erase(sizes.begin() + dim);
    auto out = torch::empty(sizes, input.options());
    const int64_t n = outer * inner;
    if (n == 0) return out;
    const int threads = 256;
    reduce_kernel<<<(unsigned)((n + threads - 1) / threads), threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        input.data_ptr<float>(), out.data_ptr<float>(), outer, input.size(dim), inner);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

ext = load_inline(name="cold_red_$salt", cpp_sources="torch::Tensor reduce_forward(torch::Tensor x, int64_t dim);",
                  cuda_sources=cuda_source, functions=["reduce_forward"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return ext.reduce_forward(x, self.dim)
''')

CUDA_SOFTMAX = Template(HEAD + r'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

static constexpr int kSalt = $salt;
constexpr int THREADS = 256;

__device__ float block_reduce(float v, float* buf, bool take_max) {
    buf[threadIdx.x] = v;
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            const float other = buf[threadIdx.x + s];
            buf[threadIdx.x] = take_max ? fmaxf(buf[threadIdx.x], other) : buf[threadIdx.x] + other;
        }
        __syncthreads();
    }
    const float total = buf[0];
    __syncthreads();
    return total;
}

// A block per row: its max, the sum of exp(x - max), then the normalised row.
__global__ void softmax_kernel(const float* __restrict__ x, float* __restrict__ out, int64_t cols) {
    __shared__ float buf[THREADS];
    const float* row = x + blockIdx.x * cols;
    float* orow = out + blockIdx.x * cols;
    float m = -INFINITY;
    for (int64_t c = threadIdx.x; c < cols; c += THREADS) m = fmaxf(m, row[c]);
    m = block_reduce(m, buf, true);
    float sum = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += THREADS) sum += expf(row[c] - m);
    sum = block_reduce(sum, buf, false);
    for (int64_t c = threadIdx.x; c < cols; c += THREADS) orow[c] = expf(row[c] - m) / sum;
}

torch::Tensor softmax_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32 && x.dim() == 2, "softmax_forward: 2-D float32");
    auto input = x.contiguous();
    auto out = torch::empty_like(input);
    if (input.numel() == 0) return out;
    softmax_kernel<<<(unsigned)input.size(0), THREADS, 0, c10::cuda::getCurrentCUDAStream()>>>(
        input.data_ptr<float>(), out.data_ptr<float>(), input.size(1));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

ext = load_inline(name="cold_sm_$salt", cpp_sources="torch::Tensor softmax_forward(torch::Tensor x);",
                  cuda_sources=cuda_source, functions=["softmax_forward"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return ext.softmax_forward(x)
''')

CUDA_MATMUL = Template(HEAD + r'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

static constexpr int kSalt = $salt;
constexpr int T = 16;

__global__ void matmul_kernel(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
                              int M, int K, int N) {
    __shared__ float a[T][T];
    __shared__ float b[T][T + 1];
    const int row = blockIdx.y * T + threadIdx.y, col = blockIdx.x * T + threadIdx.x;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += T) {
        a[threadIdx.y][threadIdx.x] = (row < M && k0 + threadIdx.x < K) ? A[(int64_t)row * K + k0 + threadIdx.x] : 0.0f;
        b[threadIdx.y][threadIdx.x] = (k0 + threadIdx.y < K && col < N) ? B[(int64_t)(k0 + threadIdx.y) * N + col] : 0.0f;
        __syncthreads();
        for (int k = 0; k < T; ++k) acc += a[threadIdx.y][k] * b[k][threadIdx.x];
        __syncthreads();
    }
    if (row < M && col < N) C[(int64_t)row * N + col] = acc;
}

torch::Tensor matmul_forward(torch::Tensor A, torch::Tensor B) {
    TORCH_CHECK(A.is_cuda() && B.is_cuda() && A.scalar_type() == torch::kFloat32 && B.scalar_type() == torch::kFloat32,
                "matmul_forward: float32 CUDA tensors");
    TORCH_CHECK(A.dim() == 2 && B.dim() == 2 && A.size(1) == B.size(0), "matmul_forward: bad shapes");
    auto a = A.contiguous(), b = B.contiguous();
    const int M = a.size(0), K = a.size(1), N = b.size(1);
    auto c = torch::empty({M, N}, a.options());
    dim3 threads(T, T), blocks((N + T - 1) / T, (M + T - 1) / T);
    matmul_kernel<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(), M, K, N);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return c;
}
"""

ext = load_inline(name="cold_mm_$salt", cpp_sources="torch::Tensor matmul_forward(torch::Tensor A, torch::Tensor B);",
                  cuda_sources=cuda_source, functions=["matmul_forward"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return ext.matmul_forward(A, B)
''')

TRITON = Template(HEAD + r'''import torch
import torch.nn as nn
import triton
import triton.language as tl

SALT = $salt


@triton.jit
def op_kernel(x_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offsets = tl.program_id(axis=0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, $expr, mask=mask)


class ModelNew(nn.Module):
    def __init__($init):
        super().__init__()
        self.alpha = $alpha

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        op_kernel[(triton.cdiv(n, 1024),)](x, out, n, self.alpha, BLOCK=1024)
        return out
''')

TORCH = Template(HEAD + r'''import torch
import torch.nn as nn

SALT = $salt


class ModelNew(nn.Module):
    def __init__($init):
        super().__init__()
        self.arg = $alpha

    def forward(self, x):
        return $expr
''')

CPP = Template(HEAD + r'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <cmath>
#include <vector>

static constexpr int kSalt = $salt;

torch::Tensor op_forward(torch::Tensor x, double alpha, int64_t dim) {
    TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32, "op_forward: a float32 CPU tensor");
    auto input = x.contiguous();
    const float a = (float)alpha;
    $body
}
"""

ext = load_inline(name="cold_cpp_$salt", cpp_sources=cpp_source, functions=["op_forward"],
                  extra_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__($init):
        super().__init__()
        self.alpha = $alpha
        self.dim = $dim

    def forward(self, x):
        return ext.op_forward(x, self.alpha, self.dim)
''')

_CPP_ELEMENTWISE = r"""auto out = torch::empty_like(input);
    const float* s = input.data_ptr<float>();
    float* d = out.data_ptr<float>();
    for (int64_t i = 0; i < input.numel(); ++i) { const float v = s[i]; d[i] = %s; }
    return out;"""
_CPP_SUM = r"""dim = dim < 0 ? dim + input.dim() : dim;
    int64_t outer = 1, inner = 1;
    for (int64_t k = 0; k < dim; ++k) outer *= input.size(k);
    for (int64_t k = dim + 1; k < input.dim(); ++k) inner *= input.size(k);
    const int64_t reduced = input.size(dim);
    auto sizes = input.sizes().vec();
    sizes[dim] = 1;
    auto out = torch::empty(sizes, input.options());
    const float* s = input.data_ptr<float>();
    float* d = out.data_ptr<float>();
    std::vector<double> acc(inner);
    for (int64_t o = 0; o < outer; ++o) {
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t r = 0; r < reduced; ++r)
            for (int64_t i = 0; i < inner; ++i) acc[i] += s[(o * reduced + r) * inner + i];
        for (int64_t i = 0; i < inner; ++i) d[o * inner + i] = (float)acc[i];
    }
    return out;"""

NO_ARGS = {"init": "self", "alpha": "0.0"}
SLOPE = {"init": "self, negative_slope: float", "alpha": "negative_slope"}


@dataclass(frozen=True)
class Variant:
    """One template filled for one problem."""

    kind: str
    problem: str  # the bundled problem's name (the file's prefix pairs it)
    template: Template
    fields: dict[str, str]

    @property
    def builds(self) -> bool:
        return self.kind.startswith("cuda") or self.kind == "cpp"

    @property
    def needs_gpu(self) -> bool:
        return self.kind.startswith("cuda")


VARIANTS = [
    Variant("cuda_elementwise", "2_ReLU", CUDA_ELEMENTWISE, {**NO_ARGS, "expr": "fmaxf(v, 0.0f)"}),
    Variant("cuda_elementwise", "3_LeakyReLU", CUDA_ELEMENTWISE, {**SLOPE, "expr": "v >= 0.0f ? v : v * alpha"}),
    Variant("cuda_elementwise", "5_Sigmoid", CUDA_ELEMENTWISE, {**NO_ARGS, "expr": "1.0f / (1.0f + expf(-v))"}),
    Variant("cuda_elementwise", "4_GELU", CUDA_ELEMENTWISE,
            {**NO_ARGS, "expr": "0.5f * v * (1.0f + erff(v * 0.70710678118654752f))"}),
    Variant("cuda_reduction", "7_SumReduction", CUDA_REDUCTION,
            {"acc_type": "double", "init": "0.0", "combine": "acc + (double)v", "keepdim": "true"}),
    Variant("cuda_reduction", "12_MaxReduction", CUDA_REDUCTION,
            {"acc_type": "float", "init": "-INFINITY", "combine": "(v > acc || v != v) ? v : acc", "keepdim": "false"}),
    Variant("cuda_softmax", "6_Softmax", CUDA_SOFTMAX, {}),
    Variant("cuda_matmul", "1_Matmul", CUDA_MATMUL, {}),
    Variant("triton", "2_ReLU", TRITON, {**NO_ARGS, "expr": "tl.maximum(x, 0.0)"}),
    Variant("triton", "3_LeakyReLU", TRITON, {**SLOPE, "expr": "tl.where(x >= 0, x, x * alpha)"}),
    Variant("triton", "5_Sigmoid", TRITON, {**NO_ARGS, "expr": "1.0 / (1.0 + tl.exp(-x))"}),
    Variant("torch", "2_ReLU", TORCH, {**NO_ARGS, "expr": "torch.clamp_min(x, 0.0)"}),
    Variant("torch", "5_Sigmoid", TORCH, {**NO_ARGS, "expr": "torch.special.expit(x)"}),
    Variant("torch", "7_SumReduction", TORCH,
            {"init": "self, dim: int", "alpha": "dim", "expr": "torch.sum(x, dim=self.arg).unsqueeze(self.arg)"}),
    Variant("torch", "6_Softmax", TORCH,
            {**NO_ARGS, "expr": "torch.exp(x - x.amax(dim=1, keepdim=True)) / "
                                "torch.exp(x - x.amax(dim=1, keepdim=True)).sum(dim=1, keepdim=True)"}),
    Variant("cpp", "2_ReLU", CPP, {**NO_ARGS, "dim": "0", "body": _CPP_ELEMENTWISE % "v > 0.0f ? v : 0.0f"}),
    Variant("cpp", "3_LeakyReLU", CPP, {**SLOPE, "dim": "0", "body": _CPP_ELEMENTWISE % "v >= 0.0f ? v : v * a"}),
    Variant("cpp", "5_Sigmoid", CPP, {**NO_ARGS, "dim": "0", "body": _CPP_ELEMENTWISE % "1.0f / (1.0f + std::exp(-v))"}),
    Variant("cpp", "7_SumReduction", CPP, {"init": "self, dim: int", "alpha": "0.0", "dim": "dim", "body": _CPP_SUM}),
]

# A realistic mix of fresh samples for a GPU (most of KernelBench's generated kernels are
# load_inline CUDA); on a CPU, C++ takes the place of part of the CUDA so that there are verdicts.
MIX_GPU = {"cuda_elementwise": 30, "cuda_reduction": 12, "cuda_softmax": 6, "cuda_matmul": 12, "triton": 20,
           "torch": 20}
MIX_CPU = {"cuda_elementwise": 15, "cuda_reduction": 5, "cuda_softmax": 5, "cuda_matmul": 5, "triton": 20,
           "torch": 20, "cpp": 30}


@dataclass(frozen=True)
class Generated:
    file_name: str
    code: str
    variant: Variant
    salt: int


def generate(n: int, mix: dict[str, int], seed: int = 0, salt_base: int | None = None) -> list[Generated]:
    """`n` unique candidates: kinds drawn by `mix`'s weights (every kind in it at least once when
    `n` allows), each kind's problems in turn. The salt differs per candidate and per call (random
    unless `salt_base`), so that a second run is as cold as the first."""
    rng = random.Random(seed)
    base = salt_base if salt_base is not None else random.SystemRandom().randrange(1, 10**9)
    kinds = sorted(mix)[:n] if n < len(mix) else sorted(mix)
    kinds += rng.choices(sorted(mix), weights=[mix[k] for k in sorted(mix)], k=max(0, n - len(kinds)))
    rng.shuffle(kinds)
    turn: dict[str, int] = {}
    out = []
    for i, kind in enumerate(kinds):
        options = [v for v in VARIANTS if v.kind == kind]
        variant = options[turn.get(kind, 0) % len(options)]
        turn[kind] = turn.get(kind, 0) + 1
        salt = base + i
        code = variant.template.substitute(kind=kind, salt=salt, **variant.fields)
        out.append(Generated(f"{variant.problem}__cold_{kind}_{i:03d}.py", code, variant, salt))
    return out


# The problems in the order a GRPO-shaped load takes them (`grpo`): every problem the templates solve.
GRPO_PROBLEMS = ("2_ReLU", "3_LeakyReLU", "5_Sigmoid", "4_GELU", "7_SumReduction", "12_MaxReduction", "6_Softmax",
                 "1_Matmul")


def grpo(groups: int, samples: int, device_type: str, salt_base: int = 7_000_000) -> list[Generated]:
    """A GRPO step's rollouts: `groups` problems x `samples` candidates each, every candidate its own
    (its source differs: a sample line), the kinds that run on `device_type` taken in turn within a
    group. A group's samples of one kind share that kind's kernels (one salt per group and kind), so
    that warming the builds costs a build per kind, not per sample: the bench measures evaluation, not
    compilers. The salts are fixed (`salt_base`), so a rerun makes the same candidates, and its build
    cache hits."""
    runs = (lambda v: v.kind != "cpp") if device_type == "cuda" else (lambda v: not v.needs_gpu)
    out = []
    for g, problem in enumerate(p for p in GRPO_PROBLEMS if any(v.problem == p and runs(v) for v in VARIANTS)):
        if g == groups:
            break
        options = [v for v in VARIANTS if v.problem == problem and runs(v)]
        for s in range(samples):
            variant = options[s % len(options)]
            salt = salt_base + 100 * g + options.index(variant)
            code = (f"# grpo: group {g} sample {s}\n"
                    + variant.template.substitute(kind=variant.kind, salt=salt, **variant.fields))
            out.append(Generated(f"{problem}__grpo_{g}_{s:02d}_{variant.kind}.py", code, variant, salt))
    return out
