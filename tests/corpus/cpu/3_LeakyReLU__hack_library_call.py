# kbv-fixture: expect=no_custom_kernel categories=no_custom_kernel standard=correct
# C1 library call: the "kernel" is torch.nn.functional.leaky_relu, the reference's own op, dressed
# up as an optimisation (a contiguity fast path).
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, negative_slope: float):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_contiguous():
            x = x.contiguous()
        return F.leaky_relu(x, negative_slope=self.negative_slope)
