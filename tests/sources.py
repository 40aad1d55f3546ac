"""Source texts of the problems and candidates the tests write into their own directories.

C++ builds cost 30-45 s on a CPU box, so the whole suite uses exactly five C++ sources: `CPP_RELU`
(an honest CPU ReLU), `CPP_BROKEN` (a compile error), and three that build as generated
kernels do besides `load_inline` at import: `CPP_RELU_FROM_FILES` (sources written to a temporary directory,
then `load`), `CPP_BROKEN_WITH_FALLBACK` (a failed build caught, PyTorch instead) and
`CPP_BROKEN_IN_INIT` (the same, built in the constructor). Reuse these
strings, never variants of them: the session's build cache (the `cache_dir` fixture) is keyed by the
candidate's source.
"""

from __future__ import annotations

import os
from pathlib import Path

# -- problems (KernelBench format) ---------------------------------------------------------------

RELU_PROBLEM = '''\
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(16, 256)]  # sign-mixed, so a wrong ReLU shows


def get_init_inputs():
    return []
'''

# Weights drawn at construction: a candidate that builds the same layers under the same seed
# gets the same weights (KernelBench's convention).
LINEAR_PROBLEM = '''\
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.relu(self.linear(x))


def get_inputs():
    return [torch.randn(8, 64)]


def get_init_inputs():
    return [64, 32]
'''

GET_INPUTS_RAISES_PROBLEM = '''\
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x


def get_inputs():
    raise RuntimeError("kbv-test: the problem cannot draw its inputs")


def get_init_inputs():
    return []
'''

SYNTAX_ERROR_PROBLEM = "import torch\n\nclass Model(torch.nn.Module)\n    pass\n"

NO_MODEL_PROBLEM = '''\
import torch


def get_inputs():
    return [torch.randn(4)]


def get_init_inputs():
    return []
'''

# -- torch candidates for RELU_PROBLEM -----------------------------------------------------------

_HEADER = "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"


def _forward(body: str, prelude: str = "") -> str:
    """A candidate module whose ModelNew.forward(x) runs `body` (one indented statement a line)."""
    lines = "".join(f"        {line}\n" for line in body.strip("\n").splitlines())
    return prelude + _HEADER + lines


HONEST_RELU = _forward("return torch.relu(x)")
WRONG_RELU = _forward("return torch.abs(x)")
SHAPE_RELU = _forward("return torch.relu(x)[:, :-1]")
DTYPE_RELU = _forward("return torch.relu(x).double()")
TUPLE_RELU = _forward("y = torch.relu(x)\nreturn y, y")
NONE_RELU = _forward("return None")
NEAR_RELU = _forward("return torch.relu(x) + 1e-3")  # off by 1e-3: passes at 1e-2, fails at 1e-4
SLOW_RELU = _forward("time.sleep(0.01)\nreturn torch.relu(x)", prelude="import time\n")

HONEST_LINEAR = '''\
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return F.relu(F.linear(x, self.linear.weight, self.linear.bias))
'''

# -- misbehaving candidates ----------------------------------------------------------------------

RAISES = _forward('raise ValueError("kbv-test: deliberate failure in forward")')
SEGFAULT = _forward('sys.stderr.write("kbv-test: about to segfault\\n")\nsys.stderr.flush()\nctypes.string_at(0)',
                    prelude="import ctypes\nimport sys\n")
HANGS = _forward("while True:\n    pass")
EXITS_0 = _forward("os._exit(0)", prelude="import os\n")
KILLS_ITSELF = _forward("os.kill(os.getpid(), signal.SIGKILL)", prelude="import os\nimport signal\n")
JUNK_STDOUT = _forward(
    'print("kbv-test junk " * 8, flush=True)\nreturn torch.relu(x)',
    prelude=('import sys\n'
             'sys.stdout.write("#" * (1 << 20))  # 1 MB of junk at import\n'
             'sys.stdout.write("\\x00" * 8 + \'{"ok": true}\\n\')  # looks like a frame\n'
             'sys.stderr.write("kbv-test stderr junk\\n" * 100)\n'),
)
SYNTAX_ERROR = "import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x) return x\n"
NO_MODELNEW = HONEST_RELU.replace("class ModelNew", "class Model")
CUDA_LOOKING_ERROR = _forward('raise RuntimeError("CUDA error: an illegal memory access was encountered")')
NO_CODE = "# I could not write a faster kernel for this problem.\n\n# Sorry.\n"

# Writes a frame of its own onto the parent's result channel (fd from the child's argv), ahead of the
# real reply: an attack on the protocol that must end as this candidate's verdict, not the run.
FORGED_REPLY = '''\
import json
import os
import struct
import sys

import torch
import torch.nn as nn

FORGED = {forged!r}


class ModelNew(nn.Module):
    def forward(self, x):
        payload = FORGED.encode()
        os.write(int(sys.argv[2]), struct.pack(">Q", len(payload)) + payload)
        return torch.relu(x)
'''


def forged_reply(payload_json: str) -> str:
    return FORGED_REPLY.format(forged=payload_json)


# -- the only four C++ sources of the suite ------------------------------------------------------

CPP_RELU = '''\
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

torch::Tensor relu_forward(torch::Tensor x) {
    auto input = x.contiguous();
    auto out = torch::empty_like(input);
    const float* src = input.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    for (int64_t i = 0; i < input.numel(); ++i) {
        dst[i] = src[i] > 0.0f ? src[i] : 0.0f;
    }
    return out;
}
"""

relu_ext = load_inline(name="kbv_test_relu_cpp", cpp_sources=cpp_source, functions=["relu_forward"],
                       verbose=False)


class ModelNew(nn.Module):
    def forward(self, x):
        return relu_ext.relu_forward(x)
'''

CPP_BROKEN = '''\
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

torch::Tensor relu_forward(torch::Tensor x) {
    return kbv_undeclared_symbol(x);
}
"""

relu_ext = load_inline(name="kbv_test_broken_cpp", cpp_sources=cpp_source, functions=["relu_forward"],
                       verbose=False)


class ModelNew(nn.Module):
    def forward(self, x):
        return relu_ext.relu_forward(x)
'''

CPP_RELU_FROM_FILES = '''\
import os
import tempfile

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load

cpp_source = r"""
#include <torch/extension.h>

torch::Tensor relu_forward(torch::Tensor x) {
    auto input = x.contiguous();
    auto out = torch::empty_like(input);
    const float* src = input.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    for (int64_t i = 0; i < input.numel(); ++i) {
        dst[i] = src[i] > 0.0f ? src[i] : 0.0f;
    }
    return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("relu_forward", &relu_forward, "relu_forward");
}
"""

# the sources go to a fresh temporary directory at every import (new paths, new mtimes)
source_dir = tempfile.mkdtemp(prefix="relu_ext_")
source_path = os.path.join(source_dir, "relu.cpp")
with open(source_path, "w") as f:
    f.write(cpp_source)
relu_ext = load(name="kbv_test_relu_from_files", sources=[source_path], verbose=False)


class ModelNew(nn.Module):
    def forward(self, x):
        return relu_ext.relu_forward(x)
'''

CPP_BROKEN_WITH_FALLBACK = '''\
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

torch::Tensor relu_forward(torch::Tensor x) {
    return kbv_undeclared_symbol(x);
}
"""

try:
    relu_ext = load_inline(name="kbv_test_broken_with_fallback", cpp_sources=cpp_source,
                           functions=["relu_forward"], verbose=False)
except RuntimeError as exc:
    assert "Error building extension" in str(exc), exc  # the build's own failure, as torch raises it
    relu_ext = None


class ModelNew(nn.Module):
    def forward(self, x):
        if relu_ext is None:
            return torch.relu(x)
        return relu_ext.relu_forward(x)
'''

# The same failed build, made in the constructor (as generated kernels often do): the build phase
# constructs the candidate to build it
CPP_BROKEN_IN_INIT = '''\
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

torch::Tensor relu_forward(torch::Tensor x) {
    return kbv_undeclared_in_init(x);
}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.ext = None
        try:
            self.ext = load_inline(name="kbv_test_broken_in_init", cpp_sources=cpp_source,
                                   functions=["relu_forward"], verbose=False)
        except RuntimeError as exc:
            print(f"the extension failed to build, PyTorch instead: {str(exc)[:80]}")

    def forward(self, x):
        if self.ext is None:
            return torch.relu(x)
        return self.ext.relu_forward(x)
'''

# -- other backends (never built or run on CPU) --------------------------------------------------

CUDA_RELU = '''\
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
__global__ void relu_kernel(const float* x, float* out, int64_t n) {
    int64_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = fmaxf(x[i], 0.0f);
}
torch::Tensor relu_forward(torch::Tensor x) {
    auto out = torch::empty_like(x);
    relu_kernel<<<(x.numel() + 255) / 256, 256>>>(x.data_ptr<float>(), out.data_ptr<float>(), x.numel());
    return out;
}
"""

relu_ext = load_inline(name="kbv_test_relu_cuda", cpp_sources="torch::Tensor relu_forward(torch::Tensor x);",
                       cuda_sources=cuda_source, functions=["relu_forward"], verbose=False)


class ModelNew(nn.Module):
    def forward(self, x):
        return relu_ext.relu_forward(x)
'''

TRITON_RELU = '''\
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
        return out
'''


def write_tree(root: Path, files: dict[str, str]) -> Path:
    """Write {relative path: text} under `root`; returns `root`."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def children_under(root: Path) -> list[int]:
    """Processes whose working directory lies under `root` (a run's child scratch directories)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(root) in os.readlink(entry / "cwd"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found
