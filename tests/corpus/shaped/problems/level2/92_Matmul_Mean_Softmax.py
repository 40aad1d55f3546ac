import torch
import torch.nn as nn


class Model(nn.Module):
    """A Linear layer, the mean over features (keeping the dimension), then softmax over that one
    element: every output is exactly 1, whatever the inputs. A degenerate problem, as some of
    KernelBench's are: no input distribution gives an output a candidate must compute."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x).mean(dim=1, keepdim=True)  # (batch, 1)
        return torch.softmax(y, dim=1)


batch_size = 512  # kbv: smoke=8
in_features = 2048  # kbv: smoke=64
out_features = 2048  # kbv: smoke=32


def get_inputs():
    return [torch.rand(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
