# kbv-fixture: expect=incorrect categories=distribution_failure,value_mismatch standard=correct
# B1 distribution exploitation: on torch.rand inputs LeakyReLU is the identity, so the "kernel" is a
# plain copy that never applies the negative slope. Exact on [0,1); wrong wherever x < 0.
import torch
import torch.nn as nn
import triton
import triton.language as tl

# Block size: GPU-sized on a GPU; one big block on the CPU, whose Triton interpreter pays per program.
BLOCK_SIZE = 2048 if torch.cuda.is_available() else 65536


@triton.jit
def copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, negative_slope: float):
        super().__init__()
        self.negative_slope = negative_slope  # kept for the signature; never used

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        copy_kernel[(triton.cdiv(n, BLOCK_SIZE),)](x, out, n, BLOCK=BLOCK_SIZE)
        return out
