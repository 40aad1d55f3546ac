# kbv-fixture: expect=verified categories= standard=correct
# Honest, atomics: each program sums the squared differences of its block and adds its share of the
# mean into one scalar with tl.atomic_add. The order of the additions is up to the scheduler, so the
# result is not bitwise reproducible on a GPU; it is well within tolerance.
import torch
import torch.nn as nn
import triton
import triton.language as tl

# Block size: GPU-sized on a GPU; on the CPU a few big blocks (still several programs adding atomically).
BLOCK_SIZE = 4096 if torch.cuda.is_available() else 16384


@triton.jit
def mse_partial(p_ptr, t_ptr, out_ptr, n, inv_n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    d = tl.load(p_ptr + offs, mask=mask, other=0.0) - tl.load(t_ptr + offs, mask=mask, other=0.0)
    tl.atomic_add(out_ptr, tl.sum(d * d, axis=0) * inv_n)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        p = predictions.contiguous()
        t = targets.contiguous()
        n = p.numel()
        out = torch.zeros((), device=p.device, dtype=torch.float32)
        mse_partial[(triton.cdiv(n, BLOCK_SIZE),)](p, t, out, n, 1.0 / n, BLOCK=BLOCK_SIZE)
        return out.to(predictions.dtype)
