"""The sandbox child: `python -m kbv.sandbox.child CMD_FD RES_FD`.

This module is the only place candidate code is ever imported (see `_import_candidate`). It holds
no seeds, no reference outputs and no inputs beyond those of the request in hand. It reads pickled
commands from CMD_FD and writes JSON replies to RES_FD; stdout and stderr are the candidate's and are
never parsed.

Commands (dicts with an "op"):
    hello                       -> versions and device
    build   path                -> import the candidate once (compiles its extensions), nothing else
    load    source, ...         -> import and construct the model (candidate or reference)
    forward inputs, outputs     -> run once, copy the outputs into the parent's buffers
    time    inputs, config      -> per-call times (ms)
    exit
Errors come back as {"error": {"kind": compile|runtime|cuda, "type", "message", "traceback"}}.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import traceback
import types
from typing import Any

_TRACEBACK_CHARS = 8000


class _CompileFailure(Exception):
    """Importing the candidate (and so building its extensions) failed."""


class Child:
    def __init__(self, res_fd: int) -> None:
        import torch

        from kbv.timing import Clock

        self.torch = torch
        self.res_fd = res_fd
        self.device = torch.device(os.environ.get("KBV_DEVICE", "cpu"))
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.clock = Clock(self.device)  # bound before any candidate import
        self.model: Any = None

    # -- commands -----------------------------------------------------------------------------
    def op_hello(self, cmd: dict[str, Any]) -> dict[str, Any]:
        torch = self.torch
        info = {"pid": os.getpid(), "torch": torch.__version__, "device": str(self.device)}
        if self.device.type == "cuda":
            info["device_name"] = torch.cuda.get_device_name(self.device)
        return info

    def op_build(self, cmd: dict[str, Any]) -> dict[str, Any]:
        _import_candidate(cmd["path"])
        return {"built": True}

    def op_load(self, cmd: dict[str, Any]) -> dict[str, Any]:
        from kbv.precision import apply_policy, snapshot_flags

        torch = self.torch
        apply_policy(cmd.get("precision", "default"))
        if cmd["source"] == "candidate":
            module = _import_candidate(cmd["path"])
            cls = getattr(module, "ModelNew", None)
            if cls is None:
                raise _CompileFailure("the candidate defines no ModelNew")
        else:
            module = _exec_reference(cmd["code"], cmd["origin"])
            cls = module.Model
        apply_policy(cmd.get("precision", "default"))  # re-asserted after candidate import
        init_args = [self._arg(a) for a in cmd.get("init_args", [])]
        if cmd.get("seed") is not None:
            torch.manual_seed(cmd["seed"])
            if self.device.type == "cuda":
                torch.cuda.manual_seed(cmd["seed"])
        with torch.no_grad():
            model = cls(*init_args)
            if isinstance(model, torch.nn.Module):
                model = model.to(self.device)
        self.model = model
        self.sync()
        n_params = sum(p.numel() for p in model.parameters()) if isinstance(model, torch.nn.Module) else 0
        return {"loaded": True, "params": n_params, "flags": snapshot_flags()}

    def op_forward(self, cmd: dict[str, Any]) -> dict[str, Any]:
        torch = self.torch
        args = [self._arg(a) for a in cmd["inputs"]]
        buffers = [self._arg(h, to_device=False) for h in cmd["outputs"]]
        with torch.no_grad():
            result = self.model(*args)
        self.sync()
        outs = list(result) if isinstance(result, (tuple, list)) else [result]
        meta = [_describe(o) for o in outs]
        copied = len(outs) == len(buffers)
        for out, buf, m in zip(outs, buffers, meta):
            ok = (isinstance(out, torch.Tensor) and tuple(out.shape) == tuple(buf.shape)
                  and out.dtype == buf.dtype)
            m["copied"] = bool(ok)
            if ok:
                buf.copy_(out.detach())
            copied = copied and ok
        self.sync()
        return {"outputs": meta, "count": len(outs), "copied": copied}

    def op_time(self, cmd: dict[str, Any]) -> dict[str, Any]:
        from kbv.timing import StandardTimerConfig, time_kernelbench

        torch = self.torch
        args = [self._arg(a) for a in cmd["inputs"]]
        config = StandardTimerConfig(**cmd.get("config", {}))
        with torch.no_grad():
            samples = time_kernelbench(self.clock, self.model, args, config)
        return {"samples_ms": samples, "tampered": self.clock.tampered()}

    # -- helpers ------------------------------------------------------------------------------
    def sync(self) -> None:
        self.clock.sync()

    def _arg(self, value: Any, to_device: bool = True) -> Any:
        """A command argument as the model sees it: shared tensors mapped (and moved to the device)."""
        from kbv.sandbox.wire import TensorHandle, map_tensor

        if isinstance(value, TensorHandle):
            value = map_tensor(value)
        if to_device and isinstance(value, self.torch.Tensor):
            return value.to(self.device)
        return value

    def reply(self, payload: dict[str, Any]) -> None:
        from kbv.sandbox.wire import send_reply

        send_reply(self.res_fd, payload)


def _describe(out: Any) -> dict[str, Any]:
    import torch

    if not isinstance(out, torch.Tensor):
        return {"type": type(out).__name__, "tensor": False}
    return {"type": type(out).__name__, "tensor": True, "exact_type": type(out) is torch.Tensor,
            "shape": list(out.shape), "dtype": str(out.dtype).removeprefix("torch."),
            "device": str(out.device)}


def _import_candidate(path: str) -> types.ModuleType:
    """Import the candidate file as module `kbv_candidate` (idempotent within a process)."""
    if "kbv_candidate" in sys.modules:
        return sys.modules["kbv_candidate"]
    spec = importlib.util.spec_from_file_location("kbv_candidate", path)
    if spec is None or spec.loader is None:
        raise _CompileFailure(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["kbv_candidate"] = module
    try:
        # ---------------------------------------------------------------------------------------
        # UNTRUSTED CODE RUNS HERE: the candidate module's top level (and its extension builds).
        # ---------------------------------------------------------------------------------------
        spec.loader.exec_module(module)
    except BaseException as exc:
        del sys.modules["kbv_candidate"]
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        raise _CompileFailure(_format_exc(exc)) from exc
    return module


def _exec_reference(code: str, origin: str) -> types.ModuleType:
    module = types.ModuleType("kbv_reference")
    exec(compile(code, origin, "exec"), module.__dict__)
    return module


def _format_exc(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-_TRACEBACK_CHARS:]


def classify_exception(exc: BaseException) -> str:
    """'cuda' for device errors (sticky or not), 'compile' for import/build failures, else 'runtime'."""
    text = f"{type(exc).__name__}: {exc}"
    cause = exc.__cause__
    if cause is not None:
        text += f" {type(cause).__name__}: {cause}"
    markers = ("AcceleratorError", "CUDA error", "cudaError", "CUDA_ERROR", "CUBLAS_STATUS",
               "CUDNN_STATUS", "device-side assert", "illegal memory access", "misaligned address")
    if any(m in text for m in markers):
        return "cuda"
    if isinstance(exc, _CompileFailure):
        return "compile"
    return "runtime"


def _error_reply(exc: BaseException) -> dict[str, Any]:
    root = exc.__cause__ if isinstance(exc, _CompileFailure) and exc.__cause__ else exc
    return {"error": {
        "kind": classify_exception(exc),
        "type": type(root).__name__,
        "message": str(root)[:2000] or type(root).__name__,
        "traceback": _format_exc(root),
    }}


def serve(cmd_fd: int, res_fd: int) -> int:
    """The command loop. Returns the exit code."""
    from kbv.sandbox.wire import WireClosed, read_frame

    import pickle

    child = Child(res_fd)
    while True:
        try:
            cmd = pickle.loads(read_frame(cmd_fd))
        except WireClosed:
            return 0
        op = cmd.get("op")
        if op == "exit":
            child.reply({"bye": True})
            return 0
        handler = getattr(child, f"op_{op}", None)
        if handler is None:
            child.reply({"error": {"kind": "harness", "type": "UnknownOp", "message": str(op), "traceback": ""}})
            continue
        try:
            result = handler(cmd)
        except Exception as exc:
            child.reply(_error_reply(exc))
            continue
        child.reply({"ok": True, **result})


def main(argv: list[str]) -> int:
    cmd_fd, res_fd = int(argv[1]), int(argv[2])
    os.set_inheritable(cmd_fd, False)
    os.set_inheritable(res_fd, False)
    return serve(cmd_fd, res_fd)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
