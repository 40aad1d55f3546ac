import torch
import torch.nn as nn


class Model(nn.Module):
    """2-D convolution, 3x3 kernel, stride 1, padding 1, with bias."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


batch_size = 64  # kbv: smoke=2
in_channels = 128  # kbv: smoke=4
out_channels = 128  # kbv: smoke=8
height = 128  # kbv: smoke=16
width = 128  # kbv: smoke=16
kernel_size = 3


def get_inputs():
    x = torch.rand(batch_size, in_channels, height, width)
    return [x]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
