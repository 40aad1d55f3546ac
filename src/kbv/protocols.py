"""Protocols as data: a named, versioned set of evaluation rules. Every verdict records which.

- `standard` reproduces KernelBench (v0.1 scripts): seed 42, five correctness trials with per-trial
  seeds drawn from it, the reference first on the same inputs, a shape check then
  `allclose(atol=rtol=1e-2)`, CUDA-event timing (3 warm-ups, 100 trials, L2 flush, mean), and a live
  eager baseline with PyTorch's default precision flags.
- `verified` is this project's protocol (see `kbv.verified`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

from kbv.timing import StandardTimerConfig

PROTOCOLS = ("standard", "verified")


@dataclass(frozen=True)
class StandardProtocol:
    """KernelBench's rules. `tolerance` is atol = rtol (1e-2 as in v0/v0.1; 1e-4 as KernelBench HEAD)."""

    seed: int = 42
    correctness_trials: int = 5
    tolerance: float = 1e-2
    timer: StandardTimerConfig = field(default_factory=StandardTimerConfig)
    precision: str = "default"  # PyTorch's default flags for reference, baseline and candidate
    name: str = "standard"

    @property
    def version(self) -> str:
        return f"kernelbench-v0.1+tol{self.tolerance:g}"

    @property
    def primary_baseline(self) -> str:
        return "eager"

    def fingerprint(self) -> str:
        """Hash of every rule: results under different rules never mix on resume."""
        return _fingerprint(asdict(self))


def _fingerprint(data: dict) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]
