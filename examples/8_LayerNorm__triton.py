# Honest: LayerNorm over the last dimension as a Triton kernel: each program normalises a block of
# rows, the mean first, then the variance around it (two passes: no cancellation), then the affine
# transform with the module's own weight and bias (`self.ln`, named as the reference names them, so
# its weights load). Runs on a GPU (a row per program), and on a CPU under the Triton interpreter
# (TRITON_INTERPRET=1, set before triton is imported), where a program takes many rows: the
# interpreter pays per program.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def layer_norm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, n_rows, n_cols, eps,
                      BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    rows = tl.program_id(axis=0).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_COLS)
    row_mask = rows[:, None] < n_rows
    x_rows = x_ptr + rows[:, None] * n_cols
    out_rows = out_ptr + rows[:, None] * n_cols

    total = tl.zeros([BLOCK_ROWS, BLOCK_COLS], tl.float32)
    for start in range(0, n_cols, BLOCK_COLS):
        mask = row_mask & (start + cols[None, :] < n_cols)
        total += tl.load(x_rows + start + cols[None, :], mask=mask, other=0.0)
    mean = tl.sum(total, axis=1) / n_cols  # (BLOCK_ROWS,)

    squares = tl.zeros([BLOCK_ROWS, BLOCK_COLS], tl.float32)
    for start in range(0, n_cols, BLOCK_COLS):
        mask = row_mask & (start + cols[None, :] < n_cols)
        x = tl.load(x_rows + start + cols[None, :], mask=mask, other=0.0)
        centred = tl.where(mask, x - mean[:, None], 0.0)
        squares += centred * centred
    rstd = 1.0 / tl.sqrt(tl.sum(squares, axis=1) / n_cols + eps)  # (BLOCK_ROWS,)

    for start in range(0, n_cols, BLOCK_COLS):
        col_mask = start + cols < n_cols
        mask = row_mask & col_mask[None, :]
        x = tl.load(x_rows + start + cols[None, :], mask=mask, other=0.0)
        w = tl.load(w_ptr + start + cols, mask=col_mask, other=0.0)
        b = tl.load(b_ptr + start + cols, mask=col_mask, other=0.0)
        y = (x - mean[:, None]) * rstd[:, None] * w[None, :] + b[None, :]
        tl.store(out_rows + start + cols[None, :], y, mask=mask)


def triton_layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    n_cols = weight.numel()
    rows = x.contiguous().view(-1, n_cols)  # (batch * seq_len, features)
    out = torch.empty_like(rows)
    block_rows = 1 if x.is_cuda else 16
    block_cols = min(4096, triton.next_power_of_2(n_cols))
    grid = (triton.cdiv(rows.shape[0], block_rows),)
    layer_norm_kernel[grid](rows, weight.contiguous(), bias.contiguous(), out, rows.shape[0], n_cols, eps,
                            BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols)
    return out.view(x.shape)


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.ln = nn.LayerNorm(features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return triton_layer_norm(x, self.ln.weight, self.ln.bias, self.ln.eps)
