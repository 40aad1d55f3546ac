"""The static scan: each rule fires on a minimal snippet, honest candidates stay quiet, and strings or
comments neither hide nor fake a match. The `kbv scan` command through a throwaway typer app."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from kbv.scan import RULES, cpp_tokens, scan_cpp, scan_source
from kbv.scan_command import scan_command
from kbv.verdict import Category, Finding


def scan(code: str, fp32: bool = True) -> list[Finding]:
    return scan_source(textwrap.dedent(code), fp32_problem=fp32)


def rules(code: str, fp32: bool = True) -> set[str]:
    return {f.rule for f in scan(code, fp32)}


def loud(code: str, fp32: bool = True) -> list[Finding]:
    """Findings above info."""
    return [f for f in scan(code, fp32) if f.severity != "info"]


def cuda(body: str) -> str:
    """A candidate embedding `body` in a load_inline CUDA source."""
    return f'''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = r"""
#include <torch/extension.h>
{textwrap.dedent(body)}
"""
mod = load_inline(name="m", cpp_sources="torch::Tensor f(torch::Tensor x);", cuda_sources=cuda_src, functions=["f"])


class ModelNew(nn.Module):
    def forward(self, x):
        return mod.f(x)
'''


# ---- honest candidates -----------------------------------------------------------------------------

HONEST_ELEMENTWISE = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = """
#include <torch/extension.h>
#include <cuda_runtime.h>

// one thread per element; no streams, no casts
__global__ void add_kernel(const float* __restrict__ a, const float* __restrict__ b, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = a[i] + b[i];
    }
}

torch::Tensor add_cuda(torch::Tensor a, torch::Tensor b) {
    TORCH_CHECK(a.is_cuda() && b.is_cuda(), "inputs must be CUDA tensors");
    auto out = torch::empty_like(a);
    const int n = a.numel();
    const int threads = 256;
    const int blocks = (n + threads - 1) / threads;
    add_kernel<<<blocks, threads>>>(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""
cpp_source = "torch::Tensor add_cuda(torch::Tensor a, torch::Tensor b);"

add = load_inline(name="add", cpp_sources=cpp_source, cuda_sources=cuda_source, functions=["add_cuda"],
                  verbose=False, extra_cuda_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.add = add

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.add.add_cuda(a.contiguous(), b.contiguous())
'''

HONEST_TILED_MATMUL = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

TILE = 32
source = f"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#define TILE {TILE}

__global__ void matmul_tiled(const float* A, const float* B, float* C, int M, int N, int K) {{
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;
    for (int t = 0; t < (K + TILE - 1) / TILE; ++t) {{
        As[threadIdx.y][threadIdx.x] = (row < M && t * TILE + threadIdx.x < K) ? A[row * K + t * TILE + threadIdx.x] : 0.f;
        Bs[threadIdx.y][threadIdx.x] = (col < N && t * TILE + threadIdx.y < K) ? B[(t * TILE + threadIdx.y) * N + col] : 0.f;
        __syncthreads();
        for (int k = 0; k < TILE; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
        __syncthreads();
    }}
    if (row < M && col < N) C[row * N + col] = acc;
}}

torch::Tensor matmul(torch::Tensor a, torch::Tensor b) {{
    const int M = a.size(0), K = a.size(1), N = b.size(1);
    auto c = torch::zeros({{M, N}}, a.options());
    dim3 block(TILE, TILE), grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
    auto stream = at::cuda::getCurrentCUDAStream();
    matmul_tiled<<<grid, block, 0, stream>>>(a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(), M, N, K);
    return c;
}}
"""
ext = load_inline("tiled", cpp_sources="torch::Tensor matmul(torch::Tensor a, torch::Tensor b);",
                  cuda_sources=source, functions=["matmul"])


class ModelNew(nn.Module):
    def forward(self, A, B):
        return ext.matmul(A.contiguous(), B.contiguous())
'''

HONEST_TRITON = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.autotune(
    configs=[triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32}, num_warps=4),
             triton.Config({"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32}, num_warps=8)],
    key=["M", "N", "K"],
)
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptr + rm[:, None] * sam + (k * BLOCK_K + rk)[None, :] * sak,
                    mask=(rm[:, None] < M) & ((k * BLOCK_K + rk)[None, :] < K), other=0.0)
        b = tl.load(b_ptr + (k * BLOCK_K + rk)[:, None] * sbk + rn[None, :] * sbn,
                    mask=((k * BLOCK_K + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b, input_precision="ieee")
    tl.store(c_ptr + rm[:, None] * scm + rn[None, :] * scn, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    M, K = a.shape
    _, N = b.shape
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    grid = lambda META: (triton.cdiv(M, META["BLOCK_M"]), triton.cdiv(N, META["BLOCK_N"]))
    matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                        c.stride(0), c.stride(1))
    return c


class ModelNew(nn.Module):
    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        if A.dtype == torch.float16:  # a dtype test is not a cast
            raise TypeError("fp32 only")
        return matmul(A, B)
'''

HONEST_CPP_LOOP = '''
import torch
from torch import nn
from torch.utils.cpp_extension import load_inline

cpp = """
#include <torch/extension.h>
#include <ATen/Parallel.h>

/* A CPU ReLU. Not a stream in sight: cudaStreamCreate(&s) here is a comment. */
torch::Tensor relu_cpu(torch::Tensor x) {
    x = x.contiguous();
    auto out = torch::empty_like(x);
    const float* src = x.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    const int64_t n = x.numel();
    at::parallel_for(0, n, 2048, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) dst[i] = src[i] > 0.f ? src[i] : 0.f;
    });
    return out;
}
"""
relu = load_inline(name="relu_cpu", cpp_sources=cpp, functions=["relu_cpu"])


class ModelNew(nn.Module):
    def __init__(self, *args) -> None:
        super().__init__()
        self._buffers_by_shape = {}

    def forward(self, x):
        if x.numel() == 0:
            return torch.empty_like(x)
        return relu.relu_cpu(x)
'''


@pytest.mark.parametrize("code", [HONEST_ELEMENTWISE, HONEST_TILED_MATMUL, HONEST_TRITON, HONEST_CPP_LOOP],
                         ids=["elementwise", "tiled-matmul", "triton-autotune", "cpp-loop"])
def test_honest_candidates_are_quiet(code):
    assert loud(code) == []


def test_honest_candidates_have_no_info_noise_either():
    assert scan(HONEST_ELEMENTWISE) == []
    assert scan(HONEST_CPP_LOOP) == []
    assert scan(HONEST_TRITON) == []


def test_triton_default_dot_is_only_info():
    code = HONEST_TRITON.replace('tl.dot(a, b, input_precision="ieee")', "tl.dot(a, b)")
    assert loud(code) == []
    assert "KBV-S603" in rules(code)
    assert "KBV-S603" not in rules(code, fp32=False)


def test_syntax_error_is_one_finding():
    findings = scan("def f(:\n    return 1\n")
    assert [f.rule for f in findings] == ["KBV-S001"]
    assert findings[0].line == 1


def test_null_bytes_are_one_finding_not_an_exception():
    assert [f.rule for f in scan_source("x = 1\0")] == ["KBV-S001"]


# ---- every rule fires on a minimal snippet ---------------------------------------------------------

FIRES = [
    # streams
    ("KBV-S101", "import torch\ns = torch.cuda.Stream()\n"),
    ("KBV-S101", "import torch\nwith torch.cuda.stream(s):\n    pass\n"),
    ("KBV-S101", "from torch.cuda import Stream\ns = Stream()\n"),
    ("KBV-S101", "flags = ['--default-stream', 'per-thread']\n"),
    ("KBV-S102", cuda("void f() { cudaStream_t s; cudaStreamCreate(&s); }")),
    ("KBV-S102", cuda("void f() { auto s = at::cuda::getStreamFromPool(); }")),
    ("KBV-S102", cuda("void f() { cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); }")),
    ("KBV-S103", cuda("#define MK(a, b) a##b\nvoid f() { MK(cudaSt, reamCreate)(&s); }")),
    # threads and deferred work
    ("KBV-S201", "import threading\n"),
    ("KBV-S201", "from concurrent.futures import ThreadPoolExecutor\n"),
    ("KBV-S201", "import multiprocessing as mp\n"),
    ("KBV-S201", "t = __import__('threading')\nt.Thread(target=print).start()\n"),
    ("KBV-S202", cuda("#include <thread>\nvoid f() { std::thread t([]{}); t.detach(); }")),
    ("KBV-S202", cuda("void f() { pthread_t t; pthread_create(&t, nullptr, work, nullptr); }")),
    ("KBV-S202", cuda("void f() { auto r = std::async(std::launch::async, work); }")),
    ("KBV-S203", cuda("void f() { cudaLaunchHostFunc(stream, cb, nullptr); }")),
    ("KBV-S203", "import atexit\natexit.register(print)\n"),
    # monkey-patching
    ("KBV-S301", "import torch\ntorch.cuda.Event.elapsed_time = lambda self, other: 0.001\n"),
    ("KBV-S301", "import time\ntime.perf_counter = lambda: 0.0\n"),
    ("KBV-S301", "import torch\ntorch.cuda.synchronize = lambda *a: None\n"),
    ("KBV-S301", "import triton\ntriton.testing.do_bench = lambda *a, **k: 0.001\n"),
    ("KBV-S301", "import torch\nsetattr(torch.cuda.Event, 'elapsed_time', lambda s, o: 1e-3)\n"),
    ("KBV-S301", "from torch.cuda import Event as Ev\nEv.record = lambda *a: None\n"),
    ("KBV-S302", "import torch.nn.functional as F\nF.relu = lambda x: x\n"),
    ("KBV-S302", "import torch\ntorch.allclose = lambda *a, **k: True\n"),
    ("KBV-S302", "import builtins\nbuiltins.print = lambda *a: None\n"),
    ("KBV-S302", "import sys\nsys.modules['torch'] = object()\n"),
    ("KBV-S302", "import torch\nvars(torch)['allclose'] = lambda *a, **k: True\n"),
    ("KBV-S302", "__builtins__['len'] = lambda x: 0\n"),
    ("KBV-S302", "import torch\ndel torch.testing\n"),
    ("KBV-S302", "import sys\nfor mod in list(sys.modules.values()):\n    cls = getattr(mod, 'Child', None)\n"
                 "    if cls is not None:\n        cls.reply = lambda self, p: None\n"),
    ("KBV-S302", "import gc\nfor o in gc.get_objects():\n    setattr(o, 'answer', 0)\n"),
    ("KBV-S303", "import torch\nf = getattr(torch, 'mat' + 'mul')\n"),
    ("KBV-S303", "import torch\nf = getattr(torch, ''.join(['al', 'lclose']))\n"),
    ("KBV-S304", "import torch\ntorch.manual_seed(0)\n"),
    ("KBV-S304", "import torch\ng = torch.Generator().manual_seed(125432)\n"),
    # introspection
    ("KBV-S401", "import gc\n"),
    ("KBV-S401", "import inspect\n"),
    ("KBV-S401", "import importlib\n"),
    ("KBV-S401", "import sys\nm = sys.modules\n"),
    ("KBV-S401", "b = __builtins__\n"),
    ("KBV-S402", "import gc\nfor o in gc.get_objects():\n    pass\n"),
    ("KBV-S402", "import sys\nsys._getframe(1).f_globals['calculate_stats'] = None\n"),
    ("KBV-S402", "import inspect\nframe = inspect.currentframe().f_back\n"),
    ("KBV-S402", "import importlib, torch\nimportlib.reload(torch)\n"),
    ("KBV-S402", "import sys\nsys.settrace(None)\n"),
    ("KBV-S403", "import torch\nclass Lazy(torch.Tensor):\n    pass\n"),
    ("KBV-S403", "import torch\nt = torch.Tensor._make_subclass(Lazy, x)\n"),
    ("KBV-S403", "class L:\n    @classmethod\n    def __torch_function__(cls, f, t, a=(), k=None):\n        pass\n"),
    # caches and input probes
    ("KBV-S501", "C = {}\ndef forward(x):\n    k = x.data_ptr()\n    if k in C:\n        return C[k]\n"),
    ("KBV-S501", "C = {}\ndef forward(x):\n    return C.get(id(x))\n"),
    ("KBV-S501", "C = {}\ndef forward(x):\n    out = C[x.data_ptr()]\n    return out\n"),
    ("KBV-S502", "C = {}\ndef forward(x, y):\n    C[x.data_ptr()] = y\n"),
    ("KBV-S502", "def forward(self, x):\n    if x.data_ptr() == self.last_ptr:\n        pass\n"),
    ("KBV-S502", "def forward(self, x):\n    if id(x) in self._results_cache:\n        pass\n"),
    ("KBV-S502", "from collections import defaultdict\nbank = defaultdict(list)\ndef f(x):\n    bank[hash(x)].append(1)\n"),
    ("KBV-S503", "class M:\n    def forward(self, x):\n        return self._cache[tuple(x.shape)]\n"),
    ("KBV-S504", "class M:\n    def forward(self, x):\n        self._cache[x.shape] = 1\n"),
    ("KBV-S505", "import functools\nclass M:\n    @functools.lru_cache(maxsize=None)\n    def forward(self, x):\n        pass\n"),
    ("KBV-S506", "from functools import cache\n@cache\ndef run(x):\n    return x\nclass M:\n    def forward(self, x):\n        return run(x)\n"),
    ("KBV-S507", "import torch\nclass ModelNew:\n    def forward(self, x):\n        if x.min() >= 0:\n            return x\n        return x\n"),
    ("KBV-S507", "import torch\nclass ModelNew:\n    def forward(self, x):\n        if torch.all(x >= 0):\n            return x\n"),
    # input-dependent fast paths: values read on the host in a branch's test
    ("KBV-S511", "class ModelNew:\n    def forward(self, x):\n        if x.min() >= 0:\n            y = ext.fast(x)\n"
                 "        else:\n            y = ext.full(x)\n        return y\n"),
    ("KBV-S511", "import torch\nclass ModelNew:\n    def forward(self, x):\n        out = ext.f(x)\n"
                 "        if torch.all(x >= 0):\n            out = x.clone()\n        return out\n"),
    ("KBV-S511", "class ModelNew:\n    def forward(self, x):\n        m = x.abs().max().item()\n"
                 "        return ext.a(x) if m < 1e3 else ext.b(x)\n"),
    ("KBV-S511", "class ModelNew:\n    def forward(self, a, b):\n        while bool((a - b).abs().sum()):\n"
                 "            a = ext.step(a)\n        return a\n"),
    ("KBV-S511", "class ModelNew:\n    def forward(self, x):\n        y = x.contiguous()\n        if y[0, 0] > 0:\n"
                 "            pass\n        return ext.f(y)\n"),
    ("KBV-S511", "class ModelNew:\n    def forward(self, x):\n        if x.flatten()[:4].tolist() == [0, 0, 0, 0]:\n"
                 "            pass\n        return ext.f(x)\n"),
    ("KBV-S511", "import torch\nclass ModelNew:\n    def forward(self, x):\n        if torch.any(torch.isnan(x)):\n"
                 "            pass\n        return ext.f(x)\n"),
    ("KBV-S508", "class M:\n    def forward(self, x):\n        self.calls += 1\n        if self.calls > 5:\n"
                 "            return self.last\n        self.last = ext.f(x)\n        return self.last\n"),
    ("KBV-S508", "class M:\n    def forward(self, a):\n        k = a.data_ptr()\n        if k == self._k:\n"
                 "            return self._out\n        self._k, self._out = k, ext.f(a)\n        return self._out\n"),
    ("KBV-S501", "class M:\n    def forward(self, a):\n        if a.data_ptr() == self._k:\n            return self._o\n"),
    ("KBV-S501", cuda("torch::Tensor f(torch::Tensor x) {\n  static const void* last = nullptr;\n  static torch::Tensor out;\n"
                      "  if (x.data_ptr() == last) return out;\n  last = x.data_ptr();\n  return out;\n}")),
    ("KBV-S502", cuda("void f(torch::Tensor a, torch::Tensor b) { TORCH_CHECK(a.data_ptr() != b.data_ptr(), \"alias\"); }")),
    ("KBV-S509", cuda("static torch::Tensor workspace;\nvoid f() {}")),
    ("KBV-S509", cuda("static std::unordered_map<const void*, at::Tensor> bank;\nvoid f() {}")),
    # precision
    ("KBV-S601", "def f(x):\n    return x.half()\n"),
    ("KBV-S601", "def f(x):\n    return x.bfloat16()\n"),
    ("KBV-S601", "import torch\ndef f(x):\n    return x.to(torch.float16)\n"),
    ("KBV-S601", "import torch\ndef f(x):\n    return x.to(dtype=torch.bfloat16)\n"),
    ("KBV-S601", "import torch\nwith torch.autocast('cuda'):\n    pass\n"),
    ("KBV-S601", "import torch\nwith torch.cuda.amp.autocast():\n    pass\n"),
    ("KBV-S601", "import triton.language as tl\ndef k(a):\n    a = a.to(tl.float16)\n"),
    ("KBV-S601", "import triton.language as tl\ndef k(a):\n    a = a.to(tl.bfloat16)\n"),
    ("KBV-S601", "import torch\nx = torch.empty(4, dtype=torch.float8_e4m3fn)\n"),
    ("KBV-S602", "import triton.language as tl\ndef k(a, b):\n    return tl.dot(a, b, input_precision='tf32')\n"),
    ("KBV-S602", "import triton.language as tl\ndef k(a, b):\n    return tl.dot(a, b, allow_tf32=True)\n"),
    ("KBV-S602", "import triton.language as tl\ndef k(a, b, P):\n    return tl.dot(a, b, input_precision=P)\n"),
    ("KBV-S603", "import triton.language as tl\ndef k(a, b):\n    return tl.dot(a, b)\n"),
    ("KBV-S604", "import torch\ntorch.backends.cuda.matmul.allow_tf32 = True\n"),
    ("KBV-S604", "import torch\ntorch.backends.cudnn.allow_tf32 = True\n"),
    ("KBV-S604", "import torch\ntorch.set_float32_matmul_precision('high')\n"),
    ("KBV-S604", "import torch\ntorch.backends.cuda.matmul.fp32_precision = 'tf32'\n"),
    ("KBV-S604", "import torch\nsetattr(torch.backends.cuda.matmul, 'allow_tf32', True)\n"),
    ("KBV-S605", "import torch\ntorch.backends.cudnn.benchmark = True\n"),
    ("KBV-S605", "import torch\ntorch.backends.cuda.matmul.allow_tf32 = False\n"),
    ("KBV-S606", cuda("__global__ void k(const float* x, __half* y) { y[0] = __float2half(x[0]); }")),
    ("KBV-S606", cuda("__global__ void k(__nv_bfloat16* y) {}")),
    ("KBV-S606", cuda("using Element = cutlass::half_t;\nvoid f() {}")),
    ("KBV-S606", cuda("void f(torch::Tensor x) { auto h = x.to(torch::kHalf); }")),
    ("KBV-S606", cuda("void f(torch::Tensor x) { auto p = x.data_ptr<at::Half>(); }")),
    ("KBV-S606", cuda("#include <mma.h>\nusing namespace nvcuda;\n__global__ void k() { wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> a; }")),
    ("KBV-S606", cuda('__device__ void mma() { asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0}, {%1}, {%2}, {%3};" : "=f"(d) : "r"(a), "r"(b), "f"(c)); }')),
    ("KBV-S606", cuda("void f() { cublasSetMathMode(h, CUBLAS_TF32_TENSOR_OP_MATH); }")),
    ("KBV-S607", "flags = ['-O3', '--use_fast_math']\n"),
    ("KBV-S607", cuda("__global__ void k(float* y) { y[0] = __expf(y[0]); }")),
    # attribution and task spec
    ("KBV-S701", "from reference import Model\nclass ModelNew(Model):\n    pass\n"),
    ("KBV-S702", "class ModelNew(Model):\n    def forward(self, x):\n        return x\n"),
    ("KBV-S703", "from problem import Model\n"),
    ("KBV-S704", "import kbv.verdict\n"),
    ("KBV-S704", "from kernelbench.eval import eval_kernel_against_ref\n"),
    ("KBV-S705", "import torch\ndef forward(x, w):\n    try:\n        return ext.f(x, w)\n    except Exception:\n        return torch.matmul(x, w)\n"),
    ("KBV-S705", "import torch.nn.functional as F\ndef f(x):\n    try:\n        return ext.f(x)\n    except RuntimeError:\n        return F.gelu(x)\n"),
    ("KBV-S705", "class ModelNew(Model):\n    def forward(self, x):\n        try:\n            return ext.f(x)\n        except Exception:\n            return super().forward(x)\n"),
    ("KBV-S705", "def f(x, w):\n    try:\n        return ext.f(x, w)\n    except Exception:\n        return x @ w\n"),
    ("KBV-S706", cuda("torch::Tensor f(torch::Tensor a, torch::Tensor b) { return torch::matmul(a, b); }")),
    ("KBV-S706", cuda("torch::Tensor f(torch::Tensor a, torch::Tensor b) { return at::mm(a, b); }")),
    ("KBV-S706", cuda("void f() { cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &al, A, m, B, k, &be, C, m); }")),
    ("KBV-S706", cuda("void f() { cudnnConvolutionForward(h); }")),
    ("KBV-S706", cuda("torch::Tensor f(torch::Tensor a, torch::Tensor b) { return a.matmul(b); }")),
    ("KBV-S707", "import torch\nclass ModelNew:\n    def forward(self, a, b):\n        return torch.matmul(a, b)\n"),
    ("KBV-S707", "import torch.nn as nn\nclass ModelNew(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.conv = nn.Conv2d(3, 8, 3)\n    def forward(self, x):\n        return self.conv(x)\n"),
    ("KBV-S708", "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n"),
    ("KBV-S709", "import torch\nf = torch.compile(lambda x: x)\n"),
    ("KBV-S710", "import triton\n@triton.jit\ndef ghost(x_ptr):\n    pass\nclass ModelNew:\n    def forward(self, x):\n        return x\n"),
    ("KBV-S710", cuda("__global__ void ghost(float* y) { y[0] = 1.f; }\ntorch::Tensor f(torch::Tensor x) { return x; }")),
    ("KBV-S710", "from torch.utils.cpp_extension import load_inline\nm = load_inline('m', cpp_sources='torch::Tensor g(torch::Tensor x);', functions=['g'])\n"),
    # dynamic code, escapes, files, network
    ("KBV-S801", "exec('x = 1')\n"),
    ("KBV-S801", "y = eval('1 + 1')\n"),
    ("KBV-S801", "code = compile('1', '<s>', 'eval')\n"),
    ("KBV-S801", "m = __import__('os')\n"),
    ("KBV-S802", "import base64\n"),
    ("KBV-S802", "import marshal\n"),
    ("KBV-S802", "import pickle\n"),
    ("KBV-S803", "import base64\nexec(base64.b64decode('eCA9IDE='))\n"),
    ("KBV-S803", "import zlib\npayload = zlib.decompress(blob)\nexec(payload)\n"),
    ("KBV-S804", "import ctypes\n"),
    ("KBV-S804", "import cffi\n"),
    ("KBV-S804", cuda("void f() { void* h = dlopen(\"libcudart.so\", RTLD_NOW); }")),
    ("KBV-S805", "import ctypes\nctypes.memmove(dst, src, 16)\n"),
    ("KBV-S805", "f = open('/proc/self/mem', 'rb')\n"),
    ("KBV-S805", cuda("void f() { mprotect(p, 4096, PROT_READ | PROT_WRITE); }")),
    ("KBV-S806", "open('/tmp/out.txt', 'w').write('x')\n"),
    ("KBV-S806", "with open(p, mode='a') as f:\n    pass\n"),
    ("KBV-S806", "import os\nos.remove('x')\n"),
    ("KBV-S806", "import shutil\n"),
    ("KBV-S806", "from pathlib import Path\nPath('torch.py').write_text('')\n"),
    ("KBV-S806", cuda('void f() { FILE* fp = fopen("/tmp/x", "w"); }')),
    ("KBV-S807", "import os\nos.write(3, b'check: pass')\n"),
    ("KBV-S807", "import os\nf = os.fdopen(int(os.environ['FD']), 'w')\n"),
    ("KBV-S808", "import socket\n"),
    ("KBV-S808", "import urllib.request\n"),
    ("KBV-S808", "import requests\n"),
    ("KBV-S808", "from http.client import HTTPConnection\n"),
    ("KBV-S809", "import subprocess\n"),
    ("KBV-S809", "import os\nos.system('ls')\n"),
    ("KBV-S809", "import sys\nsys.exit(0)\n"),
    ("KBV-S809", "exit()\n"),
    ("KBV-S809", "raise SystemExit(0)\n"),
    ("KBV-S809", "cmd = 'pip install numpy'\n"),
    ("KBV-S810", "import os\npid = os.fork()\n"),
    ("KBV-S810", "import os\nos._exit(0)\n"),
    ("KBV-S810", "import os\nos.execv('/bin/sh', ['sh'])\n"),
    ("KBV-S810", cuda("void f() { if (fork() == 0) { execv(path, argv); } }")),
    ("KBV-S811", cuda('void f(cudaError_t e) { if (e != cudaSuccess) { printf("%s", cudaGetErrorString(e)); exit(1); } }')),
    # L2 and graphs
    ("KBV-S901", cuda("void f() { cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, size); }")),
    ("KBV-S901", cuda("void f() { cudaStreamAttrValue a; a.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting; }")),
    ("KBV-S902", "import torch\ng = torch.cuda.CUDAGraph()\n"),
    ("KBV-S902", "import torch\nwith torch.cuda.graph(g):\n    pass\n"),
    ("KBV-S902", cuda("void f() { cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal); cudaGraphLaunch(e, s); }")),
]


@pytest.mark.parametrize("rule,code", FIRES, ids=[f"{r}-{i}" for i, (r, _) in enumerate(FIRES)])
def test_rule_fires(rule, code):
    found = {f.rule: f for f in scan(code)}
    assert rule in found, f"{rule} missing; got {sorted(found)}"
    assert found[rule].severity == RULES[rule].severity
    assert found[rule].category is RULES[rule].category


def test_every_rule_has_a_firing_case():
    assert {r for r, _ in FIRES} | {"KBV-S001"} == set(RULES)


README = Path(__file__).resolve().parents[1] / "README.md"


def readme_rules() -> list[tuple[str, str, str, str]]:
    """(id, severity, category, what it flags) of each row of the README's rule table."""
    text = README.read_text(encoding="utf-8")
    block = text.split("<!-- scan-rules", 1)[1].split("<!-- /scan-rules -->", 1)[0]
    return re.findall(r"^\| (KBV-S\d{3}) \| (\w+) \| `(\w+)` \| (.*) \|$", block, re.M)


def test_the_readme_documents_exactly_the_rule_table():
    expected = [(r.id, r.severity, r.category.value, r.summary + " (fp32 problems only)" * r.fp32_only)
                for r in RULES.values()]
    assert readme_rules() == expected


def test_every_rule_the_readme_names_is_in_the_table_with_its_category():
    table = {rule: category for rule, _, category, _ in readme_rules()}
    named = set(re.findall(r"KBV-S\d{3}", README.read_text(encoding="utf-8")))
    assert named - set(table) == set() and set(table) <= set(RULES)
    assert all(RULES[rule].category.value == category for rule, category in table.items())
    # the fast path the README's prose shows is the rule the scan reports for it
    assert "KBV-S507 where the branch returns (`if x.min() >= 0: return x`)" in " ".join(README.read_text().split())
    assert rules("class ModelNew:\n    def forward(self, x):\n        if x.min() >= 0:\n            return x\n"
                 "        return ext.relu(x)\n") & {"KBV-S507", "KBV-S511"} == {"KBV-S507"}


def test_rules_are_well_formed():
    for rule in RULES.values():
        assert rule.severity in ("info", "warning", "error")
        assert isinstance(rule.category, Category)
        assert rule.id.startswith("KBV-S") and len(rule.id) == 8


# ---- does not fire on honest look-alikes ------------------------------------------------------------

QUIET = [
    ("KBV-S101", "import torch\ns = torch.cuda.current_stream()\n"),
    ("KBV-S102", cuda("void f() { auto s = at::cuda::getCurrentCUDAStream(); k<<<1, 1, 0, s>>>(); }")),
    ("KBV-S102", cuda("// cudaStreamCreate(&s);\nvoid f() {}")),
    ("KBV-S102", cuda("/* old code:\n   cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);\n*/\nvoid f() {}")),
    ("KBV-S102", cuda('void f() { printf("cudaStreamCreate is not called"); }')),
    ("KBV-S202", cuda("#include <thread>\nvoid f() {}")),
    ("KBV-S302", "import torch\nclass ModelNew(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.weight = torch.nn.Parameter(torch.ones(3))\n"),
    ("KBV-S302", "import os\nos.environ['TORCH_CUDA_ARCH_LIST'] = '9.0'\n"),
    ("KBV-S303", "import torch\nf = getattr(torch, 'matmul')\n"),
    ("KBV-S401", "print(len([1]))\n"),
    ("KBV-S501", "class M:\n    def forward(self, x):\n        assert x.data_ptr() % 16 == 0\n        return x\n"),
    ("KBV-S502", "def f(x):\n    assert x.data_ptr() % 16 == 0 and x.data_ptr() != 0\n"),
    ("KBV-S504", "def f(out, x):\n    out[:, : x.shape[1]] = 0\n"),
    ("KBV-S507", "class ModelNew:\n    def forward(self, x):\n        if x.numel() == 0:\n            return x\n        return x\n"),
    # shapes, strides, dtypes and flags are known without reading the data
    ("KBV-S511", "class ModelNew:\n    def forward(self, x):\n        if x.shape[0] > 4:\n            return ext.big(x)\n"
                 "        return ext.small(x)\n"),
    ("KBV-S511", "import torch\nclass ModelNew:\n    def forward(self, x):\n"
                 "        if x.is_contiguous() and x.numel() and len(x) > 1 and x.size(1) == 3 and x.dtype == torch.float32:\n"
                 "            pass\n        n = x.numel()\n        while n > 1:\n            n //= 2\n"
                 "        return ext.g(x) if x.stride(0) == 1 else ext.h(x)\n"),
    # the model's own state, and helpers outside forward, are not its inputs
    ("KBV-S511", "class ModelNew:\n    def forward(self, x):\n        if self.scale.item() > 1 or self.training:\n"
                 "            pass\n        self.last = x\n        if self.last is None:\n            pass\n"
                 "        return ext.f(x)\n"),
    ("KBV-S511", "class ModelNew:\n    def __init__(self, w):\n        if w.max() > 1:\n            pass\n"
                 "    def forward(self, x):\n        return ext.f(x)\n"),
    # reductions on the device, never read: no host branch
    ("KBV-S511", "class ModelNew:\n    def forward(self, x):\n        m = x.max(dim=1, keepdim=True).values\n"
                 "        return ext.f(x - m)\n"),
    ("KBV-S601", "import torch\ndef f(x):\n    if x.dtype in (torch.float16, torch.bfloat16):\n        raise TypeError\n"),
    ("KBV-S602", "import triton.language as tl\ndef k(a, b):\n    return tl.dot(a, b, input_precision='ieee')\n"),
    ("KBV-S606", cuda("__global__ void k(float* x, int n) { int half = n / 2; x[half] = 0.f; }\nvoid f() { k<<<1, 1>>>(0, 0); }")),
    ("KBV-S606", cuda('void f(torch::Tensor x) { AT_DISPATCH_FLOATING_TYPES_AND_HALF(x.scalar_type(), "f", [&] {}); }')),
    ("KBV-S705", "try:\n    import triton\nexcept ImportError:\n    triton = None\n"),
    ("KBV-S502", cuda("void f(torch::Tensor a) { TORCH_CHECK(reinterpret_cast<uintptr_t>(a.data_ptr()) % 16 == 0); }")),
    ("KBV-S502", cuda("void f(torch::Tensor a) { TORCH_CHECK(a.data_ptr() != nullptr); }")),
    ("KBV-S509", cuda("static torch::Tensor helper(torch::Tensor x) { return x; }")),
    ("KBV-S509", cuda("__global__ void k(float* y) { static __shared__ float buf[32]; y[0] = buf[0]; }\nvoid f() { k<<<1, 1>>>(0); }")),
    ("KBV-S508", "class M:\n    def forward(self, x):\n        if self.w is None:\n            self.w = x\n        return self.w\n"),
    ("KBV-S710", cuda("template <typename T>\n__global__ void __launch_bounds__(256) k(T* y) {}\nvoid f(float* y) { k<float><<<1, 256>>>(y); }")),
    ("KBV-S710", cuda("__global__ void k(float* y);\nvoid f(float* y) { void* args[] = {&y}; cudaLaunchKernel((void*)k, 1, 1, args, 0, 0); }")),
    ("KBV-S302", "import sys\nfrom_sys = sys.version\nclass M:\n    def __init__(self):\n        self.v = from_sys\n"),
    ("KBV-S705", "def f(x):\n    try:\n        return ext.f(x)\n    except RuntimeError as exc:\n        raise ValueError('bad') from exc\n"),
    ("KBV-S706", cuda("torch::Tensor f(torch::Tensor a) { auto o = torch::zeros({2, 2}, a.options()); return o; }")),
    ("KBV-S801", "import re\np = re.compile('x')\n"),
    ("KBV-S301", "class M:\n    def __init__(self):\n        setattr(self, 'record', [])\n        setattr(self, 'elapsed_time', 0.0)\n"),
    ("KBV-S806", "with open('weights.txt') as f:\n    pass\n"),
    ("KBV-S809", "class M:\n    def exit(self):\n        pass\nM().exit()\n"),
    ("KBV-S810", cuda("void f(int* kill) { kill[0] = 1; }")),
    ("KBV-S811", cuda("void f(bool exit) { if (exit) return; }")),
]


@pytest.mark.parametrize("rule,code", QUIET, ids=[f"{r}-{i}" for i, (r, _) in enumerate(QUIET)])
def test_rule_stays_quiet(rule, code):
    assert rule not in rules(code)


def test_a_fast_path_finding_is_advisory_and_an_early_return_is_reported_once():
    found = [(f.rule, f.line) for f in scan("""
        import torch
        class ModelNew(torch.nn.Module):
            def forward(self, x):
                if torch.all(x >= 0):  # ReLU of non-negative inputs is a copy
                    return ext.copy(x)
                y = ext.relu(x)
                return y if x.abs().max() < 1e30 else ext.relu_safe(x)
        """) if f.rule in ("KBV-S507", "KBV-S511")]
    assert found == [("KBV-S507", 5), ("KBV-S511", 8)]  # the early return is the more telling rule
    fast = next(f for f in scan_source(textwrap.dedent("""
        class ModelNew:
            def forward(self, x):
                return ext.a(x) if x.abs().max() < 1e30 else ext.b(x)
        """)) if f.rule == "KBV-S511")
    assert fast.severity == "warning" and fast.line == 4
    assert fast.message.startswith("... if x.abs().max() < 1e+30: forward reads input values on the host")
    assert fast.category is Category.DISTRIBUTION_FAILURE  # a hint, never a status: findings are evidence


def test_precision_rules_are_silent_in_fp16_problems():
    code = "def f(x):\n    return x.half()\n" + cuda("__global__ void k(__half* y) {}")
    assert rules(code) & {"KBV-S601", "KBV-S606"} == {"KBV-S601", "KBV-S606"}
    assert rules(code, fp32=False) & {"KBV-S601", "KBV-S606"} == set()


def test_global_flags_fire_in_every_problem():
    assert "KBV-S604" in rules("import torch\ntorch.backends.cuda.matmul.allow_tf32 = True\n", fp32=False)


# ---- a fast path chosen through a local name ------------------------------------------------------

def fast_paths(forward_body: str) -> list[tuple[str, int]]:
    """(rule, line) of the fast-path findings of a ModelNew whose forward(self, x) is `forward_body`
    (line 1 is `import torch`, the body starts on line 4)."""
    code = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
    code += textwrap.indent(textwrap.dedent(forward_body), " " * 8)
    return [(f.rule, f.line) for f in scan_source(code) if f.rule in ("KBV-S507", "KBV-S511")]


FOLLOWED = [
    # a statistic held in a name, then an early return on it
    ("flag = bool(x.min() >= 0)\nif flag:\n    return x\nreturn ext.relu(x)\n", [("KBV-S507", 5)]),
    ("nonneg = (x >= 0).all()\nif nonneg:\n    return x\nreturn ext.relu(x)\n", [("KBV-S507", 5)]),
    ("ok = x.min().item() >= 0\nif not ok:\n    return ext.relu(x)\nreturn x\n", [("KBV-S507", 5)]),
    ("lo, hi = x.min(), x.max()\nsafe = hi - lo < 1e3\nif safe and x.is_contiguous():\n    return ext.fast(x)\n"
     "return ext.full(x)\n", [("KBV-S507", 6)]),
    ("y = x.contiguous()\nm = float(y.abs().max())\nif m == 0:\n    return y\nreturn ext.f(y)\n", [("KBV-S507", 6)]),
    ("ok = x.min().item() >= 0\nif ok:\n    out = x.clone()\nelse:\n    return ext.relu(x)\nreturn out\n",
     [("KBV-S507", 5)]),
    # ... or another computation chosen by it
    ("nonneg = (x >= 0).all()\ny = ext.copy(x) if nonneg else ext.relu(x)\nreturn y\n", [("KBV-S511", 5)]),
    ("flag = bool(x.min() >= 0)\nif flag:\n    y = ext.copy(x)\nelse:\n    y = ext.relu(x)\nreturn y\n",
     [("KBV-S511", 5)]),
    ("s = x.abs().sum()\nwhile s > 1:\n    x = ext.halve(x)\n    s = x.abs().sum()\nreturn x\n", [("KBV-S511", 5)]),
    ("key = hash(x.numpy().tobytes())\nif key in self.seen:\n    return self.seen[key]\nreturn ext.f(x)\n",
     [("KBV-S507", 5)]),
]


@pytest.mark.parametrize("body,expected", FOLLOWED, ids=[f"followed-{i}" for i in range(len(FOLLOWED))])
def test_a_statistic_held_in_a_name_is_followed_into_the_branch(body, expected):
    assert fast_paths(body) == expected


NOT_FAST_PATHS = [
    # shapes, dtypes, devices, identity: known without reading the data
    "if x.dim() == 4:\n    return ext.f4(x)\nreturn ext.f(x)\n",
    "n = x.numel()\nif n == 0:\n    return x\nreturn ext.f(x)\n",
    "if x.dtype != torch.float32:\n    return ext.f(x.float())\nreturn ext.f(x)\n",
    "d = x.device\nif d.type == 'cuda' and x.is_cuda:\n    return ext.f(x)\nreturn x.relu()\n",
    # a statistic used only in arithmetic, or only described
    "scale = x.abs().max()\ny = ext.quant(x / scale)\nif y.dim() == 4:\n    return y\nreturn y.view(-1)\n",
    "s = x.sum()\nout = ext.f(x, s)\nif out is None:\n    return x\nreturn out\n",
    "m = x.amax(dim=1)\nif m.dim() == 1 and not m.is_contiguous():\n    m = m.contiguous()\nreturn ext.f(x, m)\n",
    "mean = x.mean(dim=-1, keepdim=True)\nvar = ((x - mean) ** 2).mean(dim=-1, keepdim=True)\n"
    "return ext.norm(x, mean, var)\n",
    "x = x.mean(dim=1)\nif x.is_contiguous():\n    return ext.f(x)\nreturn ext.f(x.contiguous())\n",
]


@pytest.mark.parametrize("body", NOT_FAST_PATHS, ids=[f"quiet-{i}" for i in range(len(NOT_FAST_PATHS))])
def test_shape_dtype_checks_and_statistics_in_arithmetic_are_not_fast_paths(body):
    assert fast_paths(body) == []


def test_torch_helpers_that_launch_no_kernel_are_not_torch_compute():
    """dtype promotion, shapes, devices and allocation compute nothing: not KBV-S707; real ops still are."""
    helpers = ["torch.result_type(x, 1.0)", "torch.promote_types(x.dtype, torch.float32)",
               "torch.can_cast(x.dtype, torch.float16)", "torch.is_tensor(x)", "torch.is_floating_point(x)",
               "torch.numel(x)", "torch.get_default_dtype()", "torch.finfo(x.dtype).eps", "torch.iinfo(torch.int32).max",
               "torch.Size([2, 3])", "torch.device('cpu')", "torch.broadcast_shapes(x.shape, (1,))",
               "torch.empty_like(x)", "torch.zeros(3)", "torch.empty_permuted((2, 3), (1, 0))"]
    code = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
    code += "".join(f"        v{i} = {h}\n" for i, h in enumerate(helpers)) + "        return ext.f(x)\n"
    assert [f.message for f in scan(code) if f.rule == "KBV-S707"] == []
    assert "KBV-S707" in rules(code.replace("return ext.f(x)", "return torch.relu(x)"))
    assert "KBV-S705" not in rules("import torch\ndef f(x):\n    try:\n        return ext.f(x)\n"
                                   "    except RuntimeError:\n        return torch.empty_like(x).fill_(torch.finfo(x.dtype).max)\n")


# ---- strings and comments neither hide nor fake a match --------------------------------------------


def test_a_hash_in_a_string_does_not_hide_the_rest_of_the_line():
    assert "KBV-S101" in rules('import torch\ntag = "#"; s = torch.cuda.Stream()\n')
    assert "KBV-S707" in rules('import torch\nclass ModelNew:\n    def forward(self, a, b):\n'
                               '        tag = "#"; return torch.matmul(a, b)\n')


def test_python_comments_and_docstrings_do_not_fake_matches():
    code = '''
    """Unlike others we never call torch.cuda.Stream() or threading.Thread."""
    import torch
    # torch.cuda.Event.elapsed_time = lambda *a: 0
    x = "torch.cuda.synchronize = None"
    '''
    assert rules(code) == set()


def test_cuda_stream_in_comment_does_not_fire_but_in_code_does():
    commented = cuda("// cudaStreamCreate(&s);\n__global__ void k() {}")
    live = cuda("__global__ void k() {}\nvoid f() { cudaStream_t s; cudaStreamCreate(&s); }")
    assert "KBV-S102" not in rules(commented)
    assert "KBV-S102" in rules(live)


def test_cuda_string_literal_inside_cpp_does_not_fire():
    assert "KBV-S102" not in rules(cuda('const char* name = "cudaStreamCreate";\nvoid f() {}'))


def test_cpp_raw_string_is_stripped():
    assert "KBV-S202" not in rules(cuda('const char* s = R"x(std::thread t; pthread_create(a))x";\nvoid f() {}'))


def test_embedded_line_is_python_line_plus_offset():
    code = 'import torch\nsrc = """\n#include <torch/extension.h>\nvoid f() {\n    cudaStreamCreate(&s);\n}\n"""\n'
    (f,) = [f for f in scan_source(code) if f.rule == "KBV-S102"]
    assert f.line == 5
    assert f.source == "cpp"
    assert "string at line 2, line 4 within" in f.message
    assert "cudaStreamCreate" in f.message


def test_cuda_source_is_labelled_cuda():
    (f,) = [f for f in scan(cuda("__global__ void k() { cudaStreamCreate(&s); }")) if f.rule == "KBV-S102"]
    assert f.source == "cuda"


def test_fstring_constant_parts_are_scanned():
    code = 'N = compute()\nsrc = f"""\n#include <torch/extension.h>\n#define N {N}\nvoid f() {{ std::thread t(g); }}\n"""\n'
    assert "KBV-S202" in rules(code)


def test_module_level_concatenation_is_scanned():
    code = ('head = "#include <torch/extension.h>\\nvoid f() { cudaSt"\n'
            'tail = "reamCreate(&s); }"\n'
            'src = head + tail\n')
    assert "KBV-S102" in rules(code)


def test_concatenated_api_name_string_fires():
    assert "KBV-S102" in rules('import ctypes\nname = "cudaStream" + "Create"\n')


def test_python_string_naming_a_c_api_fires():
    assert "KBV-S901" in rules('import ctypes\nfn = getattr(lib, "cudaCtxResetPersistingL2Cache")\n')


# ---- aliased monkey-patching --------------------------------------------------------------------------


def test_aliased_getattr_setattr_with_concatenated_names_fires():
    code = '''
    import torch
    E = getattr(getattr(torch, "cuda"), "Ev" + "ent")
    m = "elapsed" + "_time"
    o = getattr(E, m)
    setattr(E, m, lambda s, x: o(s, x) / 100)
    '''
    found = {f.rule: f for f in scan(code)}
    assert found["KBV-S301"].severity == "error"
    assert "torch.cuda.Event.elapsed_time" in found["KBV-S301"].message
    assert found["KBV-S301"].line == 6
    assert "KBV-S303" in found


def test_aliased_module_patch_fires():
    code = "import torch as t\nc = t.cuda\nc.Event.elapsed_time = None\n"
    assert "KBV-S301" in rules(code)


def test_self_attribute_alias_patch_fires():
    code = ("import torch\nclass M:\n    def __init__(self):\n        self.ev = torch.cuda.Event\n"
            "        self.ev.elapsed_time = lambda *a: 0.0\n")
    assert "KBV-S301" in rules(code)


def test_type_of_instance_and_class_attribute_aliases_resolve():
    assert "KBV-S301" in rules("import torch\ntype(torch.cuda.Event(enable_timing=True)).elapsed_time = None\n")
    assert "KBV-S301" in rules("import torch\ntorch.cuda.Event().__class__.record = None\n")
    assert "KBV-S301" in rules("import torch\nclass K:\n    E = torch.cuda.Event\nK.E.elapsed_time = None\n")


def test_import_module_and_dunder_import_resolve():
    code = 'import importlib\nc = importlib.import_module("torch.cuda")\nc.synchronize = lambda: None\n'
    assert "KBV-S301" in rules(code)
    assert "KBV-S302" in rules('__import__("torch").allclose = lambda *a: True\n')


def test_setattr_with_reversed_and_chr_names_fires():
    code = "import torch\nsetattr(torch.cuda.Event, 'emit_despale'[::-1], None)\n"
    assert "KBV-S301" in rules(code)
    code = "import torch\nsetattr(torch, chr(97) + 'llclose', None)\n"
    assert {"KBV-S302", "KBV-S303"} <= rules(code)


def test_setattr_on_unknown_object_with_timer_name_fires():
    assert "KBV-S301" in rules("def f(obj):\n    setattr(obj, 'elapsed_time', lambda *a: 0)\n")


def test_exec_of_patch_is_scanned_and_reported_on_the_exec_line():
    code = "x = 1\nexec('import torch\\ntorch.cuda.Event.elapsed_time = None')\n"
    (f,) = [f for f in scan_source(code) if f.rule == "KBV-S301"]
    assert f.line == 2
    assert f.message.startswith("exec'd code:")


def test_base64_payload_is_decoded_and_scanned():
    import base64
    payload = base64.b64encode(b"import torch\ntorch.cuda.synchronize = lambda: None").decode()
    found = rules(f"import base64\nexec(base64.b64decode('{payload}'))\n")
    assert {"KBV-S301", "KBV-S803", "KBV-S801"} <= found


def test_reassigning_own_attributes_is_not_patching():
    assert loud("class M:\n    def __init__(self):\n        self.elapsed_time = 0.0\n") == []


# ---- tokenizer ------------------------------------------------------------------------------------


def test_cpp_tokens_strip_comments_and_merge_qualified_names():
    toks = cpp_tokens('a::b :: c(x); // std::thread\n/* pthread_create */ "std::async" y')
    assert [t for k, t, _ in toks if k == "id"] == ["a::b::c", "x", "y"]
    assert [t for k, t, _ in toks if k == "str"] == ["std::async"]
    assert toks[-1][2] == 2


def test_scan_cpp_reports_lines_within_the_source():
    assert scan_cpp("int x;\n\nvoid f() { cudaStreamCreate(&s); }") == [("KBV-S102", "cudaStreamCreate", 3)]


def test_scan_cpp_ignores_member_calls_with_common_names():
    assert scan_cpp("void f(P p) { p.kill(); p->exit(1); q.system(); }") == []


def test_dedupes_one_finding_per_rule_and_line():
    findings = scan("import torch\na, b = torch.cuda.Stream(), torch.cuda.Stream()\n")
    assert [f.rule for f in findings] == ["KBV-S101"]


def test_findings_are_sorted_by_line():
    findings = scan("import torch\nimport threading\ns = torch.cuda.Stream()\nimport gc\n")
    assert [f.line for f in findings] == sorted(f.line or 0 for f in findings)


def test_deep_concatenation_does_not_recurse():
    code = "s = " + " + ".join(['"a"'] * 3000) + "\n"
    assert isinstance(scan_source(code), list)


# ---- the command ----------------------------------------------------------------------------------


def make_app() -> typer.Typer:
    app = typer.Typer()
    app.command("scan")(scan_command)

    @app.command("version")
    def version() -> None:  # a second command, so `scan` stays a subcommand as in the real CLI
        pass

    return app


def run(*args: str):
    return CliRunner().invoke(make_app(), ["scan", *args], env={"COLUMNS": "250"})


@pytest.fixture
def hack_file(tmp_path):
    path = tmp_path / "hack.py"
    path.write_text("import torch\ntorch.cuda.Event.elapsed_time = lambda s, o: 1e-3\ncache = {}\n"
                    "def f(x):\n    return cache[x.data_ptr()]\n")
    return path


def test_command_prints_a_table_and_exits_0(hack_file, tmp_path):
    honest = tmp_path / "honest.py"
    honest.write_text(HONEST_ELEMENTWISE)
    result = run(str(hack_file), str(honest))
    assert result.exit_code == 0, result.output
    assert "KBV-S301" in result.output and "KBV-S501" in result.output
    assert "timer_patch" in result.output
    assert "cache[x.data_ptr()]" in result.output  # brackets are text, not markup
    assert "2 files" in result.output


def test_command_json(hack_file):
    result = run(str(hack_file), "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["files"] == [str(hack_file)]
    by_rule = {f["rule"]: f for f in data["findings"]}
    assert by_rule["KBV-S301"] == {"file": str(hack_file), "rule": "KBV-S301", "category": "timer_patch",
                                   "severity": "error", "message": by_rule["KBV-S301"]["message"], "line": 2,
                                   "source": "python"}


def test_command_no_fp32_drops_precision_rules(tmp_path):
    path = tmp_path / "half.py"
    path.write_text("def f(x):\n    return x.half()\n")
    assert "KBV-S601" in run(str(path), "--format", "json").output
    assert "KBV-S601" not in run(str(path), "--no-fp32", "--format", "json").output


def test_command_missing_file_exits_2_with_one_line(tmp_path):
    result = run(str(tmp_path / "nope.py"))
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "nope.py" in lines[0]


def test_command_directory_is_unreadable(tmp_path):
    assert run(str(tmp_path)).exit_code == 2


def test_command_unknown_format_exits_2(hack_file):
    result = run(str(hack_file), "--format", "yaml")
    assert result.exit_code == 2
    assert "yaml" in result.output


def test_command_syntax_error_is_a_finding_not_a_failure(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("def f(:\n")
    result = run(str(path), "--format", "json")
    assert result.exit_code == 0
    assert [f["rule"] for f in json.loads(result.output)["findings"]] == ["KBV-S001"]
