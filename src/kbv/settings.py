"""Resolved settings of one run: the device, the directories and the limits every stage shares."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kbv.errors import UsageError
from kbv.gate import waited_s

if TYPE_CHECKING:
    from kbv.sandbox import ChildSpec
    from kbv.sandbox.isolation import Isolation


@dataclass(frozen=True)
class Settings:
    device: str  # "cpu" or "cuda:N" (in the parent's numbering)
    run_dir: Path
    cache_dir: Path  # builds shared across runs, keyed by content hash
    timeout_s: float = 300.0  # wall clock for one pair's evaluation
    build_timeout_s: float = 900.0  # wall clock for one candidate's build
    jobs: int = 2  # parallel builds
    cuda_arch_list: str | None = None
    provenance: dict[str, Any] = field(default_factory=dict)
    sandbox: str = "auto"  # --sandbox: strict | auto | off (a Ray worker resolves it again, for itself)
    isolation: Isolation | None = None  # how children are isolated (None: the strongest available)
    pch: bool = True  # builds share precompiled torch headers (`kbv.pch`)
    build_isolation: str = "auto"  # how builds keep out of timings (`kbv.placement`)
    child_threads: int = 0  # OMP_NUM_THREADS of the children a lane times (0: their default)
    child_cpus: tuple[int, ...] = ()  # where the children a lane times run once started (`kbv.placement`)
    warm_clocks: bool = True  # a GPU's clocks are warmed before every timed window (`kbv.clocks`)
    prepare_timeout_s: float = 0.0  # wall clock for preparing one problem under one protocol (0: timeout_s)

    @property
    def prepare_limit_s(self) -> float:
        return self.prepare_timeout_s or self.timeout_s

    def compile_env(self) -> dict[str, str]:
        """The variables every child's extension builds run with: the same in build and evaluation
        children, so that an evaluation child finds its build as the build child left it."""
        if not self.pch:
            return {}
        from kbv.pch import compile_env

        return compile_env(self.cache_dir)

    @property
    def device_type(self) -> str:
        return "cuda" if self.device.startswith("cuda") else "cpu"

    @property
    def l2_bytes(self) -> int:
        """The device's L2 size (64 MiB where unknown, as on a CPU)."""
        return int(self.provenance.get("l2_cache_bytes") or (64 << 20))

    def flush_bytes(self, factor: float) -> int:
        """The L2 flush buffer of the timers: `factor` x L2 on CUDA, none on a CPU."""
        return int(factor * self.l2_bytes) if self.device_type == "cuda" else 0

    @property
    def visible_devices(self) -> str | None:
        """CUDA_VISIBLE_DEVICES for children: the one physical GPU the parent uses."""
        if self.device_type != "cuda":
            return None
        index = int(self.device.split(":")[1]) if ":" in self.device else 0
        parent_visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if parent_visible:
            ids = [v.strip() for v in parent_visible.split(",") if v.strip()]
            if index < len(ids):
                return ids[index]
        return str(index)

    @property
    def child_device(self) -> str:
        """The device as a child sees it (one visible GPU: always cuda:0)."""
        return "cuda:0" if self.device_type == "cuda" else "cpu"

    def work_dir(self, label: str) -> Path:
        return self.run_dir / "work" / label

    @property
    def private_dirs(self) -> tuple[Path, ...]:
        """What no child may see: the run directory (its database) and the build cache (other builds)."""
        return (self.run_dir, self.cache_dir)

    @contextmanager
    def child_scratch(self, label: str, build_dir: Path | None = None) -> Iterator[ChildSpec]:
        """A child spec with a fresh working directory of its own, removed afterwards (two children
        of one label, such as two samples with the same code, never share one). Reference children
        (no candidate) share an empty build directory."""
        from kbv.sandbox import ChildSpec

        root = self.run_dir / "work"
        root.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f"{label}-", dir=root))
        env = self.compile_env()
        if self.child_threads:
            env["OMP_NUM_THREADS"] = str(self.child_threads)
        try:
            yield ChildSpec(work_dir=work, build_dir=build_dir or self.cache_dir / "reference",
                            device=self.child_device, visible_devices=self.visible_devices,
                            cuda_arch_list=self.cuda_arch_list,
                            parent_device=self.device if self.device_type == "cuda" else None,
                            isolation=self.isolation, hidden=self.private_dirs,
                            extra_env=tuple(sorted(env.items())), cpus=self.child_cpus)
        finally:
            shutil.rmtree(work, ignore_errors=True)


def deadline_in(timeout_s: float) -> float:
    """The deadline of work that starts now and may take `timeout_s` of its own (for `time_left`):
    what the pair waited at the device's gate, and the parent's own work (`parent_work`), before now
    is not moved on again."""
    return time.monotonic() + timeout_s - waited_s() - parent_s()


def time_left(deadline: float, floor_s: float = 0.5) -> float:
    """Seconds until `deadline` (time.monotonic), never below `floor_s`: a call always gets a chance.
    The time the pair has waited for other pairs' timed windows on its device (`kbv.gate`), and the
    time the parent spent on its own work for it (`parent_work`: the reference remade for a trial),
    move the deadline on: a pair's timeout is for its own work."""
    return max(deadline + waited_s() + parent_s() - time.monotonic(), floor_s)


def timeout_message(message: str, limit_s: float) -> str:
    """A child's timeout said with the limit that ran out: 'no answer within 0.5 s (forward)' becomes
    '... (forward): the pair's 300 s (--timeout) ran out' (a pair's later commands get what is left)."""
    return f"{message}: the pair's {limit_s:.0f} s (--timeout) ran out"


_PARENT = threading.local()


def parent_s() -> float:
    """Seconds the calling thread has spent in `parent_work` blocks (ever: deadlines take differences)."""
    return float(getattr(_PARENT, "seconds", 0.0))


@contextmanager
def parent_work() -> Iterator[None]:
    """Mark work the parent does for itself while a pair runs (the reference's calls for a trial it
    did not keep): its seconds are not charged to the pair's timeout."""
    t0 = time.monotonic()
    try:
        yield
    finally:
        _PARENT.seconds = parent_s() + time.monotonic() - t0


def default_cache_dir() -> Path:
    env = os.environ.get("KBV_CACHE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kbv"


def resolve_device(requested: str) -> str:
    """'auto' -> 'cuda:0' when a GPU is present, else 'cpu'. Raises UsageError for an unusable device."""
    import torch

    requested = requested.strip().lower()
    if requested == "auto":
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    if requested == "cpu":
        return "cpu"
    if requested.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UsageError("--device cuda: no CUDA device is available here (use --device cpu or auto).")
        index = int(requested.split(":")[1]) if ":" in requested else 0
        if index >= torch.cuda.device_count():
            raise UsageError(f"--device {requested}: only {torch.cuda.device_count()} CUDA device(s) here.")
        return f"cuda:{index}"
    raise UsageError(f"Unknown device '{requested}': expected auto, cpu, cuda or cuda:N.")


def resolve_devices(spec: str) -> tuple[str, ...]:
    """The devices of `--devices`, one evaluation lane each: 'auto' -> every visible GPU (one CPU
    lane without a GPU); '0,1,3' -> those GPUs ('cuda:N' is accepted too); 'cpu,cpu' -> two CPU
    lanes (they share the cores: for throughput and bookkeeping, not for speed claims).
    Raises UsageError for anything else, in one line."""
    import torch

    text = spec.strip().lower()
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if text == "auto":
        return tuple(f"cuda:{i}" for i in range(count)) or ("cpu",)
    items = [item.strip() for item in text.split(",")]
    expected = "expected auto, GPU indices such as 0,1,3, or CPU lanes such as cpu,cpu"
    if not items or any(not item for item in items):
        raise UsageError(f"--devices '{spec}': {expected}.")
    if all(item == "cpu" for item in items):
        return tuple(items)
    indices = []
    for item in items:
        digits = item.removeprefix("cuda:")
        if not digits.isdigit():
            raise UsageError(f"--devices '{spec}': '{item}' is not a GPU index ({expected}; no mixing).")
        indices.append(int(digits))
    if len(set(indices)) != len(indices):
        raise UsageError(f"--devices '{spec}': a GPU is named twice (use --pairs-per-device for several lanes on one GPU).")
    missing = [i for i in indices if i >= count]
    if missing:
        raise UsageError(f"--devices '{spec}': no GPU {missing[0]} here ({count} CUDA device(s) visible).")
    return tuple(f"cuda:{i}" for i in indices)


def cuda_arch_list(device: str) -> str | None:
    """TORCH_CUDA_ARCH_LIST for builds: the target GPU's compute capability (builds run on CPU workers)."""
    if not device.startswith("cuda"):
        return os.environ.get("TORCH_CUDA_ARCH_LIST")
    import torch

    major, minor = torch.cuda.get_device_capability(torch.device(device))
    return os.environ.get("TORCH_CUDA_ARCH_LIST", f"{major}.{minor}")
