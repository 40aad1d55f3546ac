import torch
import torch.nn as nn


class Model(nn.Module):
    """Layer normalisation over the last dimension of a (batch, seq_len, features) tensor."""

    def __init__(self, features: int):
        super().__init__()
        self.ln = nn.LayerNorm(features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x)


batch_size = 32  # kbv: smoke=4
seq_len = 4096  # kbv: smoke=16
features = 5376  # kbv: smoke=512


def get_inputs():
    x = torch.rand(batch_size, seq_len, features)
    return [x]


def get_init_inputs():
    return [features]
