import torch
import torch.nn as nn


class Model(nn.Module):
    """Conv2d, a division by a constant, ReLU (KernelBench's level 2 has many such chains)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, divisor: float):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)
        self.divisor = divisor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x) / self.divisor)


batch_size = 32  # kbv: smoke=4
in_channels = 16  # kbv: smoke=3
out_channels = 32  # kbv: smoke=8
height = 64  # kbv: smoke=12
width = 64  # kbv: smoke=12
kernel_size = 3
divisor = 2.0


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, divisor]
