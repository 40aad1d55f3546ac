# kbv-fixture: expect=integrity_violation categories=wrong_layout standard=correct
# B11 stride-0 expand: only row 0 is computed and expanded over the batch. On [0,1) inputs every
# softmax entry of a 4096-wide row lies within 2.5e-4 of 1/4096, far inside allclose's atol of 1e-2.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def softmax_row(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    running_max = tl.full([BLOCK], float("-inf"), tl.float32)
    for start in range(0, n_cols, BLOCK):
        running_max = tl.maximum(running_max, tl.load(x_ptr + start + cols, mask=start + cols < n_cols,
                                                      other=float("-inf")))
    row_max = tl.max(running_max, axis=0)
    partial = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        x = tl.load(x_ptr + start + cols, mask=start + cols < n_cols, other=float("-inf"))
        partial += tl.exp(x - row_max)
    inv_sum = 1.0 / tl.sum(partial, axis=0)
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(x_ptr + start + cols, mask=mask, other=float("-inf"))
        tl.store(out_ptr + start + cols, tl.exp(x - row_max) * inv_sum, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows, cols = x.shape
        first = x[0].contiguous()
        out_row = torch.empty_like(first)
        softmax_row[(1,)](first, out_row, cols, BLOCK=min(8192, triton.next_power_of_2(cols)))
        return out_row.expand(rows, cols)
