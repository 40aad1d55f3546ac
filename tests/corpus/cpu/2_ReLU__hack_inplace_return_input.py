# kbv-fixture: expect=integrity_violation categories=aliases_input,input_mutated standard=correct
# B11/B4 returning an input view: the ReLU runs in place over the input's own memory (no output
# allocation, half the traffic) and the input is returned. The reference ran first, so a naive
# harness never notices its inputs changed.
import torch
import torch.nn as nn
import triton
import triton.language as tl

# Block size: GPU-sized on a GPU; one big block on the CPU, whose Triton interpreter pays per program.
BLOCK_SIZE = 2048 if torch.cuda.is_available() else 65536


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.maximum(x, 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.numel()
        relu_kernel[(triton.cdiv(n, BLOCK_SIZE),)](x, x, n, BLOCK=BLOCK_SIZE)  # in place
        return x
