# kbv-fixture: expect=verified categories= standard=correct
# Honest, fast-math style: row softmax in three passes over column blocks (max, sum, write), with
# exp(x - max) evaluated as exp2((x - max) * log2(e)). Any row length fits.
import torch
import torch.nn as nn
import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
# Rows per program: one on a GPU; all of them on the CPU, whose Triton interpreter pays per program.
ROWS_PER_PROGRAM = 1 if torch.cuda.is_available() else 16


@triton.jit
def softmax_rows(x_ptr, out_ptr, n_rows, n_cols, stride, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    row_ok = rows[:, None] < n_rows
    base = rows[:, None] * stride
    running_max = tl.full([ROWS, BLOCK], float("-inf"), tl.float32)
    for start in range(0, n_cols, BLOCK):
        mask = row_ok & (start + cols[None, :] < n_cols)
        x = tl.load(x_ptr + base + start + cols[None, :], mask=mask, other=float("-inf"))
        running_max = tl.maximum(running_max, x)
    row_max = tl.max(running_max, axis=1)
    partial = tl.zeros([ROWS, BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        mask = row_ok & (start + cols[None, :] < n_cols)
        x = tl.load(x_ptr + base + start + cols[None, :], mask=mask, other=float("-inf"))
        partial += tl.exp2((x - row_max[:, None]) * LOG2E)
    inv_sum = 1.0 / tl.sum(partial, axis=1)
    for start in range(0, n_cols, BLOCK):
        mask = row_ok & (start + cols[None, :] < n_cols)
        x = tl.load(x_ptr + base + start + cols[None, :], mask=mask, other=float("-inf"))
        y = tl.exp2((x - row_max[:, None]) * LOG2E) * inv_sum[:, None]
        tl.store(out_ptr + base + start + cols[None, :], y, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        rows, cols = x.shape
        block = min(4096, triton.next_power_of_2(cols))
        softmax_rows[(triton.cdiv(rows, ROWS_PER_PROGRAM),)](x, out, rows, cols, x.stride(0),
                                                             ROWS=ROWS_PER_PROGRAM, BLOCK=block)
        return out
