"""Float32 precision flags (TF32 for matmul and cuDNN), set through one API and read back for the record.

Policies:
- `default`: PyTorch's own defaults, untouched (matmul IEEE, cuDNN TF32): KernelBench's baseline.
- `tf32`: TF32 on for matmul and cuDNN: the verified baseline.
- `fp32`: TF32 off everywhere: strict IEEE float32.

Both the legacy (`allow_tf32`) and the newer (`fp32_precision`) switches are written, and state is
read through the newer API where it exists (on recent PyTorch, the legacy getters raise after a
write through the new API).
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from kbv.gate import taken

POLICIES = ("default", "tf32", "fp32")


def snapshot_flags() -> dict[str, Any]:
    """The current precision-relevant flags, JSON-safe."""
    flags: dict[str, Any] = {"float32_matmul_precision": torch.get_float32_matmul_precision()}
    for path in ("cuda.matmul", "cudnn", "cudnn.conv", "cudnn.rnn"):
        obj = _backend(path)
        if obj is not None and hasattr(obj, "fp32_precision"):
            with contextlib.suppress(Exception):
                flags[f"{path}.fp32_precision"] = str(obj.fp32_precision)
    if not any(k.endswith("fp32_precision") for k in flags):
        with contextlib.suppress(Exception):
            flags["cuda.matmul.allow_tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
            flags["cudnn.allow_tf32"] = bool(torch.backends.cudnn.allow_tf32)
    return flags


def apply_policy(policy: str) -> None:
    """Set the flags of `policy`; 'default' leaves them as they are."""
    if policy not in POLICIES:
        raise ValueError(f"unknown precision policy {policy!r}; expected one of {POLICIES}")
    if policy == "default":
        return
    tf32 = policy == "tf32"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy switches are deprecated on recent PyTorch
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        torch.set_float32_matmul_precision("high" if tf32 else "highest")
        for path in ("cuda.matmul", "cudnn.conv", "cudnn.rnn"):
            obj = _backend(path)
            if obj is not None and hasattr(obj, "fp32_precision"):
                with contextlib.suppress(Exception):
                    obj.fp32_precision = "tf32" if tf32 else "ieee"


# The flags are the process's, not a thread's: lanes of one process (`--pairs-per-device`) that set them
# at once read each other's (the standard protocol's reference computed in a verified lane's TF32), and
# restore each other's (two blocks ended crosswise leave the process in TF32 for good). One block at a
# time, in a process: outside every block the flags are the process's own, so `default` ("as they
# are") never means another lane's.
_FLAGS = threading.RLock()


@contextlib.contextmanager
def precision_policy(policy: str) -> Iterator[None]:
    """Run a block under `policy`, restoring every flag afterwards; no other thread's block runs
    meanwhile (a block holds no lock but this one, and waits for nothing else: no gate, no room). A
    wait for another lane's block is the pair's waited time (`kbv.gate.taken`), not its own."""
    with taken(_FLAGS), flags_restored():
        apply_policy(policy)
        yield


@contextlib.contextmanager
def flags_restored() -> Iterator[None]:
    """Every precision flag as it was when the block began, once it ends; other threads are not kept
    out (a test's guard around its whole body, whose lanes set flags in blocks of their own)."""
    saved = _raw_state()
    try:
        yield
    finally:
        _restore(saved)


def _backend(path: str) -> Any:
    obj: Any = torch.backends
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _raw_state() -> dict[str, Any]:
    state: dict[str, Any] = {"matmul_precision": torch.get_float32_matmul_precision()}
    for path in ("cuda.matmul", "cudnn", "cudnn.conv", "cudnn.rnn"):
        obj = _backend(path)
        if obj is not None and hasattr(obj, "fp32_precision"):
            with contextlib.suppress(Exception):
                state[path] = obj.fp32_precision
    if len(state) == 1:
        state["legacy"] = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    return state


def _restore(state: dict[str, Any]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.set_float32_matmul_precision(state["matmul_precision"])
        if "legacy" in state:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = state["legacy"]
        for path in ("cuda.matmul", "cudnn", "cudnn.conv", "cudnn.rnn"):
            if path in state:
                with contextlib.suppress(Exception):
                    _backend(path).fp32_precision = state[path]
