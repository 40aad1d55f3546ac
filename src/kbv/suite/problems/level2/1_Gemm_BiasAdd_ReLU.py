import torch
import torch.nn as nn


class Model(nn.Module):
    """Linear layer, then an extra bias added, then ReLU: relu(x @ W.T + b_linear + bias)."""

    def __init__(self, in_features: int, out_features: int, bias_shape: tuple):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.gemm(x)
        x = x + self.bias
        return torch.relu(x)


batch_size = 4096  # kbv: smoke=16
in_features = 4096  # kbv: smoke=256
out_features = 4096  # kbv: smoke=128
bias_shape = (out_features,)


def get_inputs():
    x = torch.rand(batch_size, in_features)
    return [x]


def get_init_inputs():
    return [in_features, out_features, bias_shape]
