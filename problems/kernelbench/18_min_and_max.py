import torch
import torch.nn as nn


class Model(nn.Module):
    """Two outputs: each row's smallest and largest element. No template family matches: search it with --llm."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor):
        return torch.amin(x, dim=1), torch.amax(x, dim=1)


batch_size = 4096
dim = 8192


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
