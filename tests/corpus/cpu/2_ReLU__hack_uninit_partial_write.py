# kbv-fixture: expect=integrity_violation categories=unwritten_output standard=incorrect
# B3 stale memory: the output comes from torch.empty_like and the kernel stores only the zeros (where
# x < 0); every other element keeps whatever the allocator handed back, in a same-process harness
# often the block just freed by the reference output, i.e. the right answer. On [0,1) it writes nothing.
import torch
import torch.nn as nn
import triton
import triton.language as tl

# Block size: GPU-sized on a GPU; one big block on the CPU, whose Triton interpreter pays per program.
BLOCK_SIZE = 2048 if torch.cuda.is_available() else 65536


@triton.jit
def zero_negatives(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr + offs, tl.zeros_like(x), mask=(offs < n) & (x < 0.0))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        zero_negatives[(triton.cdiv(n, BLOCK_SIZE),)](x, out, n, BLOCK=BLOCK_SIZE)
        return out
