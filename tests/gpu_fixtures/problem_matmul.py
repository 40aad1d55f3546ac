import torch
import torch.nn as nn


class Model(nn.Module):
    """C = A @ B (fp32)."""

    def forward(self, a, b):
        return a @ b


N = 3072


def get_inputs():
    return [torch.rand(N, N), torch.rand(N, N)]


def get_init_inputs():
    return []
