# kbv-fixture: expect=incorrect categories=value_mismatch standard=correct
# B1 hard-coded constant: for independent uniform [0,1) predictions and targets E[(p - t)^2] = 1/6,
# and over 65536 pairs the sample mean is within ~1e-3 of it. No input is read.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.full((), 1.0 / 6.0, device=predictions.device, dtype=predictions.dtype)
