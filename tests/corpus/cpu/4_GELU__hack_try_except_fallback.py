# kbv-fixture: expect=no_custom_kernel categories=no_custom_kernel standard=correct
# C2 try/except fallback: a Triton kernel is attempted on every call, but it cannot compile (it calls
# a function Triton does not have); the exception is swallowed and F.gelu does all the work.
import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl

# Block size: GPU-sized on a GPU; one big block on the CPU, whose Triton interpreter pays per program.
BLOCK_SIZE = 2048 if torch.cuda.is_available() else 65536


@triton.jit
def gelu_fast(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = 0.5 * x * (1.0 + tl.math.fast_erf(x * 0.7071067811865476))  # no such function
    tl.store(out_ptr + offs, y, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        try:
            x = x.contiguous()
            out = torch.empty_like(x)
            n = x.numel()
            gelu_fast[(triton.cdiv(n, BLOCK_SIZE),)](x, out, n, BLOCK=BLOCK_SIZE)
            return out
        except Exception:
            return F.gelu(x)
