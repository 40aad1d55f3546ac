# kbv-fixture: expect=verified categories= standard=correct
# Honest, shaped like a real level-2 kernel: the GEMM through the library (cuBLAS on a GPU), the
# bias and the ReLU fused in one Triton epilogue. Its weights outweigh its inputs and outputs.
import torch
import torch.nn as nn
import triton
import triton.language as tl

BLOCK = 1024 if torch.cuda.is_available() else 4096


@triton.jit
def bias_relu(y_ptr, b_ptr, out_ptr, n, cols, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    mask = offs < n
    y = tl.load(y_ptr + offs, mask=mask, other=0.0)
    b = tl.load(b_ptr + offs % cols, mask=mask, other=0.0)
    tl.store(out_ptr + offs, tl.maximum(y + b, 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.mm(x, self.linear.weight.t())  # (batch, out_features)
        out = torch.empty_like(y)
        n = y.numel()
        bias_relu[(triton.cdiv(n, BLOCK),)](y, self.linear.bias, out, n, y.shape[1], BLOCK=BLOCK)
        return out
