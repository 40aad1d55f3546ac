import torch
import torch.nn as nn


class Model(nn.Module):
    """Multi-layer perceptron: (Linear, ReLU) per hidden layer, then a final Linear."""

    def __init__(self, input_size: int, layer_sizes: list, output_size: int):
        super().__init__()
        layers = []
        current = input_size
        for size in layer_sizes:
            layers += [nn.Linear(current, size), nn.ReLU()]
            current = size
        layers.append(nn.Linear(current, output_size))
        self.network = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x)


batch_size = 2048  # kbv: smoke=8
input_size = 4096  # kbv: smoke=256
layer_sizes = [4096, 4096]  # kbv: smoke=[256, 128]
output_size = 1024  # kbv: smoke=64


def get_inputs():
    x = torch.rand(batch_size, input_size)
    return [x]


def get_init_inputs():
    return [input_size, layer_sizes, output_size]
