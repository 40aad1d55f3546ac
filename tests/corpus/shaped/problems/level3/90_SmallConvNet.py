import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """A small convolutional network: two conv-BatchNorm-ReLU-maxpool stages, then two Linear
    layers. BatchNorm in training mode; the classifier's weights outweigh the inputs."""

    def __init__(self, in_channels: int, channels: int, image_size: int, hidden: int, num_classes: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, 2 * channels, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(2 * channels)
        self.fc1 = nn.Linear(2 * channels * (image_size // 4) ** 2, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)  # (batch, channels, H/2, W/2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)  # (batch, 2 channels, H/4, W/4)
        x = torch.flatten(x, 1)  # (batch, 2 channels * H/4 * W/4)
        return self.fc2(F.relu(self.fc1(x)))


batch_size = 128  # kbv: smoke=2
in_channels = 3
channels = 32  # kbv: smoke=4
image_size = 64  # kbv: smoke=16
hidden = 1024  # kbv: smoke=32
num_classes = 10


def get_inputs():
    return [torch.rand(batch_size, in_channels, image_size, image_size)]


def get_init_inputs():
    return [in_channels, channels, image_size, hidden, num_classes]
