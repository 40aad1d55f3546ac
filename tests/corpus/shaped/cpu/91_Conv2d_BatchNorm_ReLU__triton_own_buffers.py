# kbv-fixture: expect=verified categories= standard=correct
# Honest, with BatchNorm's state laid out its own way (as real level-2 kernels do): the affine
# parameters and the running mean and variance are the module's own top-level tensors, not an
# nn.BatchNorm2d's, so its state dict does not match the reference's (both are built under the same
# seed). In training mode it updates its running statistics as the reference does its own.
import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl

BLOCK = 1024 if torch.cuda.is_available() else 16384


@triton.jit
def relu(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    mask = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask, other=0.0), 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)
        self.gamma = nn.Parameter(torch.ones(out_channels))
        self.beta = nn.Parameter(torch.zeros(out_channels))
        self.register_buffer("running_mean", torch.zeros(out_channels))
        self.register_buffer("running_var", torch.ones(out_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.conv2d(x, self.conv.weight, self.conv.bias, padding=self.conv.padding)
        y = F.batch_norm(y, self.running_mean, self.running_var, self.gamma, self.beta,
                         training=self.training, momentum=0.1, eps=1e-5).contiguous()
        out = torch.empty_like(y)
        relu[(triton.cdiv(y.numel(), BLOCK),)](y, out, y.numel(), BLOCK=BLOCK)
        return out
