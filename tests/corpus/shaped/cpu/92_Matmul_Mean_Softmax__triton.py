# kbv-fixture: expect=unsound_problem categories=unsound_problem standard=correct
# Honest, on a degenerate problem: the Linear layer through the library, the mean and the one-element
# softmax in Triton. Every output is 1 whatever the inputs, so no verdict of the verified protocol
# can mean anything: its status says so, with no speedup.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def mean_softmax(y_ptr, out_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for c0 in range(0, cols, BLOCK):
        acc += tl.load(y_ptr + row * cols + c0 + offs, mask=c0 + offs < cols, other=0.0)
    m = tl.sum(acc, axis=0) / cols
    tl.store(out_ptr + row, tl.exp(m - m) / tl.exp(m - m))  # softmax over one element


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x).contiguous()  # (batch, out_features)
        out = torch.empty((y.shape[0], 1), device=y.device, dtype=y.dtype)
        mean_softmax[(y.shape[0],)](y, out, y.shape[1], BLOCK=1024)
        return out
