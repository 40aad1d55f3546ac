# kbv-fixture: expect=no_custom_kernel categories=no_custom_kernel standard=correct
# C4 ghost kernel that does run: each call launches the Triton kernel on a 1-element scratch tensor
# (so a launch counter sees a custom kernel every call) and returns torch.sigmoid(x). Removing the
# kernel would not change a single output value.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def sigmoid_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, 1.0 / (1.0 + tl.exp(-x)), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scratch = torch.zeros(2, device=x.device, dtype=x.dtype)
        sigmoid_kernel[(1,)](scratch, scratch[1:], 1, BLOCK=16)  # "keeps the kernel warm"
        return torch.sigmoid(x)
