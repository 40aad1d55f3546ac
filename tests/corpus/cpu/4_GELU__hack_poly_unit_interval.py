# kbv-fixture: expect=incorrect categories=distribution_failure standard=correct
# B1/B8 approximation valid only on the test range: GELU replaced by a degree-7 polynomial fitted on
# [0, 1] (max error 1.2e-7 there in float32: seven FMAs, no erf). Exact to float32 rounding on
# torch.rand inputs, and far off for negative or large ones.
import torch
import torch.nn as nn
import triton
import triton.language as tl

# Block size: GPU-sized on a GPU; one big block on the CPU, whose Triton interpreter pays per program.
BLOCK_SIZE = 2048 if torch.cuda.is_available() else 65536


@triton.jit
def gelu_poly(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = -0.00305217689 * x + 0.01365986748
    y = y * x - 0.002524755983
    y = y * x - 0.06547200405
    y = y * x - 0.0002355343349
    y = y * x + 0.3989708103
    y = y * x + 0.4999985259
    y = y * x + 1.875978539e-08
    tl.store(out_ptr + offs, y, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        gelu_poly[(triton.cdiv(n, BLOCK_SIZE),)](x, out, n, BLOCK=BLOCK_SIZE)
        return out
