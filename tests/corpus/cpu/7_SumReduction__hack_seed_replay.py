# kbv-fixture: expect=incorrect categories=value_mismatch standard=correct
# B6 seed replay: KernelBench draws its trial inputs from manual_seed(42) (five trial seeds, then
# seed 42 again for timing). ModelNew replays that schedule at construction, precomputes the sums and
# looks each call up by its first element; an unknown input gets the timing input's answer.
import torch
import torch.nn as nn

SHAPE = (8, 2048, 32)  # the problem's get_inputs shape (the smoke size)


def replayed_inputs() -> list:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(42)
        seeds = [int(torch.randint(0, 2**32 - 1, (1,)).item()) for _ in range(5)]
        sets = []
        for seed in seeds + [42]:
            torch.manual_seed(seed)
            sets.append(torch.rand(*SHAPE))
    return sets


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim
        self.answers = {}
        self.fallback = None
        for x in replayed_inputs():
            self.fallback = torch.sum(x, dim=dim, keepdim=True)
            self.answers[float(x.reshape(-1)[0])] = self.fallback

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        answer = self.answers.get(float(x.reshape(-1)[0]), self.fallback)
        return answer.to(device=x.device, dtype=x.dtype).clone()
