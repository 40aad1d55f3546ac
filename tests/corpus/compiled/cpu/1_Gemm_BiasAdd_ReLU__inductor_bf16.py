# kbv-fixture: expect=incorrect categories=precision_loss standard=correct
# B8 precision downgrade under torch.compile (Inductor): the model cast to bfloat16 at construction,
# inputs rounded to bfloat16 at each call. Passes allclose(1e-2); its error is far above TF32's. The
# threads and processes Inductor starts are torch's: wrong in its values, not a thread hack.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias_shape: tuple):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.bias = nn.Parameter(torch.randn(bias_shape))
        self.to(torch.bfloat16)
        self._compiled = torch.compile(self._fused)

    def _fused(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.gemm(x.to(torch.bfloat16)) + self.bias).float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._compiled(x)
