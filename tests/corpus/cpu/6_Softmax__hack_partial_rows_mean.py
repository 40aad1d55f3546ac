# kbv-fixture: expect=incorrect categories=value_mismatch standard=correct
# B7 partial computation: the first two rows are computed, every other row is filled with their mean
# (1/4096 here). The whole output stays within allclose(1e-2) of the truth on [0,1) inputs.
import torch
import torch.nn as nn
import triton
import triton.language as tl

COMPUTED_ROWS = 2


@triton.jit
def softmax_rows(x_ptr, out_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    running_max = tl.full([BLOCK], float("-inf"), tl.float32)
    for start in range(0, n_cols, BLOCK):
        x = tl.load(x_ptr + row * stride + start + cols, mask=start + cols < n_cols, other=float("-inf"))
        running_max = tl.maximum(running_max, x)
    row_max = tl.max(running_max, axis=0)
    partial = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        x = tl.load(x_ptr + row * stride + start + cols, mask=start + cols < n_cols, other=float("-inf"))
        partial += tl.exp(x - row_max)
    inv_sum = 1.0 / tl.sum(partial, axis=0)
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(x_ptr + row * stride + start + cols, mask=mask, other=float("-inf"))
        tl.store(out_ptr + row * stride + start + cols, tl.exp(x - row_max) * inv_sum, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        rows, cols = x.shape
        out = torch.empty_like(x)
        done = min(COMPUTED_ROWS, rows)
        softmax_rows[(done,)](x, out, cols, x.stride(0), BLOCK=min(8192, triton.next_power_of_2(cols)))
        out[done:] = out[:done].mean()
        return out
