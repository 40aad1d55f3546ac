import torch
import torch.nn as nn


class Model(nn.Module):
    """A wide Linear layer, then ReLU: relu(x @ W.T + b). At full size its weights (128 MiB) outweigh
    one set of inputs and outputs (48 MiB), as in most of KernelBench's levels 2 and 3."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


batch_size = 1024  # kbv: smoke=16
in_features = 8192  # kbv: smoke=256
out_features = 4096  # kbv: smoke=128


def get_inputs():
    return [torch.rand(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
