# kbv-fixture: expect=integrity_violation categories=aliases_parameter standard=correct
# B-class output aliasing: the output lives in a buffer the module keeps and every call overwrites
# (no allocation per call: a common "optimisation"). A harness that compares each output before the
# next call sees nothing wrong; a caller holding two outputs finds the first one changed. The buffer
# is its own (the reference has none): writing it is not parameter_mutated, returning it is aliasing.
import torch
import torch.nn as nn
import triton
import triton.language as tl

BLOCK_SIZE = 2048 if torch.cuda.is_available() else 65536


@triton.jit
def relu_into(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("out", torch.empty(0), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        if self.out.shape != x.shape or self.out.device != x.device or self.out.dtype != x.dtype:
            self.out = torch.empty_like(x)
        n = x.numel()
        relu_into[(triton.cdiv(n, BLOCK_SIZE),)](x, self.out, n, BLOCK=BLOCK_SIZE)
        return self.out
