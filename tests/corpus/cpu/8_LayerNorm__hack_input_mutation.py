# kbv-fixture: expect=integrity_violation categories=input_mutated standard=correct
# B4 input mutation: the kernel normalises each row in place in the input's memory (it "reuses the
# buffer") and writes only the affine result to the output. The reference already ran on the inputs,
# and LayerNorm of a normalised row is itself again, so timing loops over the same input never notice.
import torch
import torch.nn as nn
import triton
import triton.language as tl

# Rows per program: one on a GPU; many on the CPU, whose Triton interpreter pays per program.
ROWS_PER_PROGRAM = 1 if torch.cuda.is_available() else 64


@triton.jit
def layer_norm_in_place(x_ptr, w_ptr, b_ptr, out_ptr, n_rows, features, eps,
                        ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < features)
    offs = rows[:, None] * features + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    mean = tl.sum(x, axis=1) / features
    centred = tl.where(mask, x - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=1) / features + eps)
    normed = centred * rstd[:, None]
    tl.store(x_ptr + offs, normed, mask=mask)  # scratch space: the input itself
    w = tl.load(w_ptr + cols, mask=cols < features, other=0.0)
    b = tl.load(b_ptr + cols, mask=cols < features, other=0.0)
    tl.store(out_ptr + offs, normed * w[None, :] + b[None, :], mask=mask)


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.ln = nn.LayerNorm(features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.ln.normalized_shape[0]
        rows = x.numel() // features
        out = torch.empty_like(x)
        layer_norm_in_place[(triton.cdiv(rows, ROWS_PER_PROGRAM),)](
            x, self.ln.weight, self.ln.bias, out, rows, features, self.ln.eps,
            ROWS=ROWS_PER_PROGRAM, BLOCK=triton.next_power_of_2(features))
        return out
