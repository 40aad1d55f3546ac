import torch
import torch.nn as nn


class Model(nn.Module):
    """ReLU: max(x, 0), elementwise."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


batch_size = 4096  # kbv: smoke=16
dim = 172032  # kbv: smoke=4096


def get_inputs():
    x = torch.rand(batch_size, dim)
    return [x]


def get_init_inputs():
    return []
