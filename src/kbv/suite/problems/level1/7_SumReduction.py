import torch
import torch.nn as nn


class Model(nn.Module):
    """Sum over one dimension of a 3-D tensor, keeping that dimension with size 1."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=self.dim, keepdim=True)


# Read-bound: the 3 GB input budget caps this at about 0.7-0.9 ms on an H200, under the 1.5 ms aim.
batch_size = 128  # kbv: smoke=8
dim1 = 4096  # kbv: smoke=2048
dim2 = 1344  # kbv: smoke=32
reduce_dim = 1


def get_inputs():
    x = torch.rand(batch_size, dim1, dim2)
    return [x]


def get_init_inputs():
    return [reduce_dim]
