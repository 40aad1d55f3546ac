import torch
import torch.nn as nn


class Model(nn.Module):
    """Mean squared error: mean((predictions - targets)^2) over all elements, a 0-d tensor."""

    def __init__(self):
        super().__init__()

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.mean((predictions - targets) ** 2)


batch_size = 4096  # kbv: smoke=16
dim = 65536  # kbv: smoke=4096


def get_inputs():
    # No random scale factor, unlike KernelBench's current version: under uniform [0,1) inputs the
    # answer concentrates at 1/6, which is the classic constant-output weakness this problem keeps.
    predictions = torch.rand(batch_size, dim)
    targets = torch.rand(batch_size, dim)
    return [predictions, targets]


def get_init_inputs():
    return []
