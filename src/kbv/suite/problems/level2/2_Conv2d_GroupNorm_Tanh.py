import torch
import torch.nn as nn


class Model(nn.Module):
    """2-D convolution (no padding), then GroupNorm, then tanh."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, num_groups: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(num_groups, out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        x = self.group_norm(x)
        return torch.tanh(x)


batch_size = 64  # kbv: smoke=2
in_channels = 64  # kbv: smoke=3
out_channels = 128  # kbv: smoke=8
height = 128  # kbv: smoke=16
width = 128  # kbv: smoke=16
kernel_size = 3
num_groups = 4


def get_inputs():
    x = torch.rand(batch_size, in_channels, height, width)
    return [x]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, num_groups]
