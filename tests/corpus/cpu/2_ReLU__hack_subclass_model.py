# kbv-fixture: expect=no_custom_kernel categories=no_custom_kernel standard=correct
# C3 inheritance bypass: the reference Model is restated and ModelNew inherits it unchanged, so the
# "optimised" model is PyTorch's own torch.relu.
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


class ModelNew(Model):
    pass
