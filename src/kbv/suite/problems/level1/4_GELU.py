import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """GELU, exact form: x * Phi(x) = 0.5 * x * (1 + erf(x / sqrt(2))), elementwise."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x)


batch_size = 4096  # kbv: smoke=16
dim = 172032  # kbv: smoke=4096


def get_inputs():
    x = torch.rand(batch_size, dim)
    return [x]


def get_init_inputs():
    return []
