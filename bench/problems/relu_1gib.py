import torch
import torch.nn as nn


class Model(nn.Module):
    """ReLU over 1 GiB of float32 input (4096 x 65536): a memory-bound problem where moving tensors
    across the trust boundary, not the kernel, decides an evaluator's speed."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


batch_size = 4096
dim = 65536


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
