# kbv-fixture: expect=integrity_violation categories=not_a_tensor standard=correct
# A3 lazy output: forward returns a torch.Tensor subclass over uninitialised memory (made with
# _make_subclass) and does no work; the first torch operation that touches it (the harness's
# allclose, a copy) runs the real Triton kernel through __torch_function__. The timer sees nothing.
import torch
import torch.nn as nn
import triton
import triton.language as tl

# Block size: GPU-sized on a GPU; one big block on the CPU, whose Triton interpreter pays per program.
BLOCK_SIZE = 2048 if torch.cuda.is_available() else 65536


@triton.jit
def sigmoid_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, 1.0 / (1.0 + tl.exp(-x)), mask=mask)


class Deferred(torch.Tensor):
    """A tensor whose values are computed when first used."""

    def materialize(self) -> None:
        pending = self.__dict__.pop("_pending", None)
        if pending is None:
            return
        with torch._C.DisableTorchFunctionSubclass():
            plain = self.as_subclass(torch.Tensor)
            x = pending.contiguous()
            n = x.numel()
            sigmoid_kernel[(triton.cdiv(n, BLOCK_SIZE),)](x, plain, n, BLOCK=BLOCK_SIZE)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        for a in list(args) + list((kwargs or {}).values()):
            if isinstance(a, Deferred):
                a.materialize()
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.Tensor._make_subclass(Deferred, torch.empty_like(x, memory_format=torch.contiguous_format))
        out._pending = x
        return out
