"""Child side of attribution: one forward under PyTorch's Kineto profiler on GPU, listing device kernels and
their device time; on CPU, the forward's wall time (the guards count the candidate's own launches)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any


def profile_forward(fn: Any, args: Sequence[Any], device: Any, clock: Any) -> dict[str, Any]:
    """One profiled forward. Returns {"wall_ms", "kernels": [{"name", "us", "in_ext"}]}."""
    import torch

    if device.type != "cuda":
        t0 = time.perf_counter()
        fn(*args)
        return {"wall_ms": (time.perf_counter() - t0) * 1e3, "kernels": []}
    clock.sync()
    t0 = time.perf_counter()
    prof = _kineto_profile()
    try:
        prof.__enter__()
    except Exception as exc:  # no profiler here: attribution falls back to launch counts
        fn(*args)
        clock.sync()
        return {"wall_ms": (time.perf_counter() - t0) * 1e3,
                "kernels": [{"name": f"<profiler failed: {type(exc).__name__}: {exc}>", "us": 0.0, "error": True}]}
    try:
        fn(*args)
        torch.cuda.synchronize()
    finally:
        prof.__exit__(None, None, None)
    wall_ms = (time.perf_counter() - t0) * 1e3
    return {"wall_ms": wall_ms, "kernels": _device_kernels(prof)}


def _kineto_profile() -> Any:
    """The autograd profiler on Kineto, CPU and CUDA activities: what `torch.profiler.profile` wraps.
    Not that wrapper: its first start imports `torch._inductor` (seconds) to read one setting."""
    import torch

    return torch.autograd.profiler.profile(use_cpu=True, use_device="cuda", use_kineto=True)


def _device_kernels(prof: Any) -> list[dict[str, Any]]:
    """Device kernels of a profile, from whichever form this PyTorch gives them in: events of their
    own, or (older) hung off the CPU events that launched them. Where both are there (PyTorch 2 hangs
    a copy of each kernel an op launched off the op), the kernel's own event alone is counted."""
    import torch

    kernels: list[dict[str, Any]] = []
    hung: list[dict[str, Any]] = []
    try:
        for ev in prof.function_events:
            if getattr(ev, "device_type", None) == torch.autograd.DeviceType.CUDA:
                us = getattr(ev, "device_time", None)
                if us is None:
                    us = getattr(ev, "cuda_time", 0.0)
                kernels.append({"name": ev.name, "us": float(us or 0.0)})
            for k in getattr(ev, "kernels", []) or []:
                hung.append({"name": k.name, "us": float(getattr(k, "duration", 0.0))})
        kernels = kernels or hung
    except Exception as exc:  # attribution then falls back to launch counts
        kernels.append({"name": f"<profiler failed: {type(exc).__name__}: {exc}>", "us": 0.0, "error": True})
    return kernels


def warm_profiler(device: Any) -> None:
    """Start and stop the profiler once on a trivial op: its first start takes seconds (CUPTI)."""
    import torch

    try:
        with _kineto_profile():
            torch.zeros(1, device=device).add_(1)
            torch.cuda.synchronize(device)
    except Exception:  # attribution then pays the start itself, or reports the profiler's failure
        pass
