# kbv-fixture: expect=no_custom_kernel categories=no_custom_kernel standard=correct
# C5 torch.compile wrapper through Inductor (C++ on a CPU): compiled at construction, so Inductor's own
# compile pool thread and its compiler and probe processes start inside the candidate's calls. They are
# torch's, not the candidate's: no kernel of its own, and no thread or process of its own either.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias_shape: tuple):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.bias = nn.Parameter(torch.randn(bias_shape))
        self._compiled = torch.compile(self._fused)

    def _fused(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.gemm(x) + self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._compiled(x)
