import torch
import torch.nn as nn


class Model(nn.Module):
    """Conv2d, BatchNorm2d, ReLU. KernelBench never calls eval(): BatchNorm runs in training mode,
    normalises by the batch's own statistics and updates its running mean and variance every call."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)
        self.bn = nn.BatchNorm2d(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


batch_size = 64  # kbv: smoke=4
in_channels = 32  # kbv: smoke=3
out_channels = 64  # kbv: smoke=8
height = 64  # kbv: smoke=12
width = 64  # kbv: smoke=12
kernel_size = 3


def get_inputs():
    return [torch.rand(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
