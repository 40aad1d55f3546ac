# kbv-fixture: expect=verified categories= standard=correct
# Honest, shaped like a real level-3 kernel: convolutions, BatchNorm (training mode, running
# statistics updated) and the Linear layers through the library; every ReLU a Triton kernel.
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


def triton_relu(x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty_like(x)
    relu[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), BLOCK=BLOCK)
    return out


class ModelNew(nn.Module):
    def __init__(self, in_channels: int, channels: int, image_size: int, hidden: int, num_classes: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, 2 * channels, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(2 * channels)
        self.fc1 = nn.Linear(2 * channels * (image_size // 4) ** 2, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(triton_relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(triton_relu(self.bn2(self.conv2(x))), 2)
        return self.fc2(triton_relu(self.fc1(torch.flatten(x, 1))))
