import torch
import torch.nn as nn


class Model(nn.Module):
    """LeakyReLU with a slope given at construction."""

    def __init__(self, negative_slope: float = 0.01):
        super().__init__()
        self.act = nn.LeakyReLU(negative_slope)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(x)


batch_size = 4096
dim = 8192


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [0.2]
