# Honest: row softmax as a Triton kernel (one program per row, an online max/sum pass and a write
# pass over column blocks, so any row length fits). Runs on a GPU, and on a CPU under the Triton
# interpreter (TRITON_INTERPRET=1, set before triton is imported).
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(x_ptr, out_ptr, n_cols, row_stride, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(axis=0)
    x_row = x_ptr + row * row_stride
    out_row = out_ptr + row * row_stride
    cols = tl.arange(0, BLOCK_SIZE)

    # Pass 1: running max and running sum of exp(x - max), rescaled whenever the max grows.
    row_max = tl.full([BLOCK_SIZE], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_SIZE], tl.float32)
    for start in range(0, n_cols, BLOCK_SIZE):
        mask = start + cols < n_cols
        x = tl.load(x_row + start + cols, mask=mask, other=float("-inf"))
        new_max = tl.maximum(row_max, x)
        # Lanes that have seen only padding keep max = -inf; guard them against inf - inf = nan.
        safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
        row_sum = row_sum * tl.exp(row_max - safe_max) + tl.exp(x - safe_max)
        row_max = new_max
    total_max = tl.max(row_max, axis=0)
    total_sum = tl.sum(row_sum * tl.exp(row_max - total_max), axis=0)

    # Pass 2: normalise and write.
    for start in range(0, n_cols, BLOCK_SIZE):
        mask = start + cols < n_cols
        x = tl.load(x_row + start + cols, mask=mask, other=float("-inf"))
        tl.store(out_row + start + cols, tl.exp(x - total_max) / total_sum, mask=mask)


def triton_softmax(x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    n_rows, n_cols = x.shape
    out = torch.empty_like(x)
    block_size = min(4096, triton.next_power_of_2(n_cols))
    softmax_kernel[(n_rows,)](x, out, n_cols, x.stride(0), BLOCK_SIZE=block_size)
    return out


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return triton_softmax(x)
