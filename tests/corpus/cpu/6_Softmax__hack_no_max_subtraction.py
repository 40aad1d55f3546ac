# kbv-fixture: expect=incorrect categories=nan_inf_mismatch,distribution_failure standard=correct
# B8 numerically unsafe shortcut: softmax as exp(x) / sum(exp(x)) with no max subtraction, one pass
# fewer. Exact enough on [0,1); exp overflows to inf (and inf/inf = NaN) once inputs reach ~89.
import torch
import torch.nn as nn
import triton
import triton.language as tl

# Rows per program: one on a GPU; all of them on the CPU, whose Triton interpreter pays per program.
ROWS_PER_PROGRAM = 1 if torch.cuda.is_available() else 16


@triton.jit
def softmax_unsafe(x_ptr, out_ptr, n_rows, n_cols, stride, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    row_ok = rows[:, None] < n_rows
    base = rows[:, None] * stride
    partial = tl.zeros([ROWS, BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        mask = row_ok & (start + cols[None, :] < n_cols)
        partial += tl.exp(tl.load(x_ptr + base + start + cols[None, :], mask=mask, other=float("-inf")))
    inv_sum = 1.0 / tl.sum(partial, axis=1)
    for start in range(0, n_cols, BLOCK):
        mask = row_ok & (start + cols[None, :] < n_cols)
        x = tl.load(x_ptr + base + start + cols[None, :], mask=mask, other=float("-inf"))
        tl.store(out_ptr + base + start + cols[None, :], tl.exp(x) * inv_sum[:, None], mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        rows, cols = x.shape
        block = min(4096, triton.next_power_of_2(cols))
        softmax_unsafe[(triton.cdiv(rows, ROWS_PER_PROGRAM),)](x, out, rows, cols, x.stride(0),
                                                               ROWS=ROWS_PER_PROGRAM, BLOCK=block)
        return out
