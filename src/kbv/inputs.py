"""Drawing inputs. The standard protocol draws them exactly as KernelBench does; the verified
protocol's hidden distributions live in `kbv.distributions`."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from kbv.gate import taken


def set_seed(seed: int) -> None:
    """KernelBench's `set_seed`: the CPU and CUDA generators."""
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed(seed)


# The global generators are the process's, not a thread's: a lane that seeds them while another lane
# draws from them changes the other's draws. An H100's sweep with two lanes failed KernelBench's L2/22
# identity 0/5 under the standard protocol, by 1.56 (1.6% of its outputs): what two draws of its
# 8192 x 8192 weights give, far past TF32's error. One seeded block at a time, in a process.
_RNG = threading.RLock()


@contextlib.contextmanager
def rng_isolated() -> Iterator[None]:
    """Restore the global RNG state afterwards (seeding for a problem must not leak), and keep every
    other thread's seeded block out meanwhile (a block waits for nothing else: no gate, no room). A
    wait for another lane's block is the pair's waited time (`kbv.gate.taken`), not its own."""
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with taken(_RNG), torch.random.fork_rng(devices=devices):
        yield


def kernelbench_trial_seeds(seed: int, n: int) -> list[int]:
    """KernelBench's per-trial seeds: `manual_seed(seed)`, then n draws of randint(0, 2**32 - 1)."""
    with rng_isolated():
        torch.manual_seed(seed)
        return [int(torch.randint(0, 2**32 - 1, (1,)).item()) for _ in range(n)]


def tensor_bytes(values: Iterable[Any]) -> int:
    """The bytes of the tensors among `values` (other values count nothing)."""
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


def to_device(values: Sequence[Any], device: torch.device) -> list[Any]:
    """Tensors moved to `device`; other values unchanged."""
    return [v.to(device) if isinstance(v, torch.Tensor) else v for v in values]


def flatten_outputs(result: Any) -> list[torch.Tensor]:
    """A forward's result as a list of tensors (a tensor, or a tuple/list of tensors)."""
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (tuple, list)) and all(isinstance(r, torch.Tensor) for r in result):
        return list(result)
    raise TypeError(f"forward returned {type(result).__name__}, not a tensor or a tuple of tensors")
