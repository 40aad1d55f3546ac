import torch
import torch.nn as nn
import torch.nn.functional as F


class ResidualBlock(nn.Module):
    """conv3x3-GroupNorm-ReLU, conv3x3-GroupNorm, add the input, ReLU."""

    def __init__(self, channels: int, num_groups: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.gn1 = nn.GroupNorm(num_groups, channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.gn2 = nn.GroupNorm(num_groups, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.gn1(self.conv1(x)))
        out = self.gn2(self.conv2(out))
        return F.relu(out + x)


class Model(nn.Module):
    """A small ResNet: a conv3x3 stem, two residual blocks, global average pooling, a Linear classifier."""

    def __init__(self, in_channels: int, channels: int, num_classes: int, num_groups: int):
        super().__init__()
        self.stem = nn.Conv2d(in_channels, channels, 3, padding=1, bias=False)
        self.stem_gn = nn.GroupNorm(num_groups, channels)
        self.blocks = nn.Sequential(ResidualBlock(channels, num_groups), ResidualBlock(channels, num_groups))
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.stem_gn(self.stem(x)))  # (batch, channels, H, W)
        x = self.blocks(x)
        x = x.mean(dim=(2, 3))  # (batch, channels)
        return self.fc(x)


batch_size = 64  # kbv: smoke=2
in_channels = 3
channels = 128  # kbv: smoke=8
height = 64  # kbv: smoke=16
width = 64  # kbv: smoke=16
num_classes = 1000  # kbv: smoke=10
num_groups = 4


def get_inputs():
    x = torch.rand(batch_size, in_channels, height, width)
    return [x]


def get_init_inputs():
    return [in_channels, channels, num_classes, num_groups]
