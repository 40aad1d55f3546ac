"""What a candidate builds at import, built (or failed) once: in its build child, and found by every
evaluation child of the same candidate (ARCHITECTURE §15, "Nothing compiles on a lane").

`install` wraps `torch.utils.cpp_extension._jit_compile`, the step in which `load` and `load_inline`
both end, in every child before any candidate code is imported. A call is keyed by what it compiles
(`jit_key`): its name, the content of its sources (never their paths or mtimes: a candidate that
writes its sources to a fresh temporary directory at every import has the same key in every child),
the headers beside them, its flags and kind, and the toolchain's variables. What the call did is
recorded under `$TORCH_EXTENSIONS_DIR/kbv-jit/<key>/`, in the candidate's content-hash build
directory, which its evaluation children see (and write, in the sandbox):

- built: a copy of the library, under the module name the build gave it. A later call of the key
  imports that copy, and runs no compiler, ninja or lock.
- failed to build (a compile or link error): the exception's type and message. A later call raises
  the same at once, so a candidate that catches it takes its fallback as it did in the build. A
  failure the machine caused (a compiler killed, a full disk: `transient`) is not recorded.

A call whose key is not recorded compiles as torch would, and records what it did (a candidate
whose build failed on the CPU worker for want of a GPU, and is retried on the device): its time
shows in the verdict's `load` stage, under the pair's deadline. The record is the candidate's own
(its children can write it, as they can its build outputs); no other candidate's child sees it.
"""

from __future__ import annotations

import builtins
import functools
import hashlib
import inspect
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

CACHE_DIR = "kbv-jit"
_RECORD = "record.json"
_FLAGS = ("extra_cflags", "extra_cuda_cflags", "extra_sycl_cflags", "extra_ldflags", "extra_include_paths")
_KIND = ("with_cuda", "with_sycl", "is_python_module", "is_standalone")
_TOOLCHAIN_ENV = ("CXX", "CC", "KBV_REAL_CXX", "CUDA_HOME", "TORCH_CUDA_ARCH_LIST", "NVCC_APPEND_FLAGS",
                  "NVCC_PREPEND_FLAGS")
_HEADERS = (".h", ".hh", ".hpp", ".hxx", ".cuh", ".inl", ".inc")
_MAX_FILES = 1000  # files a directory named in a flag may hold and still be keyed by its content
_MAX_BYTES = 64 << 20

# what the build step did in this thread's call: `built` (module name, directory, standalone) or
# `failed` (the exception it raised)
_step = threading.local()


def install(extensions_dir: str | None) -> None:
    """Wrap torch's JIT build step so that it consults the records under `extensions_dir`
    (TORCH_EXTENSIONS_DIR). Trusted: called before any candidate import. Does nothing without a
    directory, or with a torch that has no such step."""
    from torch.utils import cpp_extension

    compile_ = getattr(cpp_extension, "_jit_compile", None)
    build = getattr(cpp_extension, "_write_ninja_file_and_build_library", None)
    if not extensions_dir or compile_ is None or build is None:
        return
    cpp_extension._write_ninja_file_and_build_library = _noting(build)
    cpp_extension._jit_compile = _cached(compile_, Path(extensions_dir) / CACHE_DIR)


def _noting(build: Callable[..., Any]) -> Callable[..., Any]:
    """The build step, noting what it built or raised: only what a call's own build step did is
    recorded (never a library left in the directory by another build, nor a failure to import)."""
    signature = inspect.signature(build)

    @functools.wraps(build)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            result = build(*args, **kwargs)
        except Exception as exc:
            _step.failed = exc
            raise
        try:
            step = signature.bind(*args, **kwargs).arguments
            _step.built = (str(step["name"]), str(step["build_directory"]), bool(step.get("is_standalone")))
        except (TypeError, KeyError):
            pass
        return result

    return wrapper


def _cached(compile_: Callable[..., Any], root: Path) -> Callable[..., Any]:
    """`_jit_compile`, answered from the records under `root` where its key has one, else run and
    recorded (what its own build step built, or the failure that step raised)."""
    signature = inspect.signature(compile_)

    @functools.wraps(compile_)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return compile_(*args, **kwargs)  # torch says what is wrong with the call
        bound.apply_defaults()
        call = dict(bound.arguments)
        try:
            key = jit_key(call)
        except Exception:  # a source that cannot be read, a call torch refuses: torch says so
            return compile_(*args, **kwargs)
        entry = root / key
        record = _read(entry)
        if record is not None:
            return _replay(record, entry, call)
        _step.built = _step.failed = None
        try:
            return compile_(*args, **kwargs)
        except Exception as exc:
            if exc is _step.failed and not transient(str(exc)):
                _write(entry, {"failed": {"type": type(exc).__name__, "message": str(exc)}})
            raise
        finally:
            if _step.built is not None:  # (also when its import failed: a later import fails alike)
                _record_built(entry, *_step.built)
            _step.built = _step.failed = None

    return wrapper


# A build that failed for the machine's sake, not the code's: a compiler killed (out of memory on a
# busy build pool), a full disk. Recorded, it would make the candidate take its fallback in every
# later run; unrecorded, the next call builds again.
_TRANSIENT = ("killed", "terminated by signal", "no space left on device", "cannot allocate memory", "out of memory",
              "resource temporarily unavailable", "too many open files", "timed out", "interrupted system call")


def transient(message: str) -> bool:
    """Whether a build's failure message says the machine, not the code, failed it."""
    text = message.lower()
    return any(marker in text for marker in _TRANSIENT)


# -- the key --------------------------------------------------------------------------------------

def jit_key(call: dict[str, Any]) -> str:
    """The key of one `_jit_compile` call (its arguments by name): what it compiles, not where."""
    import torch

    sources = [call["sources"]] if isinstance(call["sources"], str) else list(call["sources"])
    parts = {
        "name": str(call["name"]),
        "sources": [[Path(s).suffix, _file_digest(s), _headers_beside(s)] for s in map(str, sources)],
        "flags": {k: [_flag(str(a)) for a in _as_list(call.get(k))] for k in _FLAGS},
        "kind": [call.get(k) for k in _KIND],
        "env": {k: os.environ.get(k, "") for k in _TOOLCHAIN_ENV},
        "torch": torch.__version__,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _file_digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _headers_beside(source: str) -> list[list[str]]:
    """The headers in a source's directory, by name and content: what `#include "x.h"` finds there."""
    folder = Path(source).resolve().parent
    try:
        found = sorted(p for p in folder.iterdir() if p.suffix in _HEADERS and p.is_file())
    except OSError:
        return []
    return [[p.name, _file_digest(str(p))] for p in found[:_MAX_FILES]]


def _flag(arg: str) -> str:
    """A flag as keyed: one that names a path in the child's own scratch space (its working and
    temporary directories, new in every child) by what is there, any other as it is."""
    for prefix in ("", "-I", "-L", "-isystem"):
        path = arg[len(prefix):]
        if arg.startswith(prefix) and os.path.isabs(path) and _in_scratch(path) and os.path.exists(path):
            return prefix + "<" + _path_digest(Path(path)) + ">"
    return arg


def _in_scratch(path: str) -> bool:
    real = os.path.realpath(path)
    extensions = os.path.realpath(os.environ.get("TORCH_EXTENSIONS_DIR") or os.devnull)
    roots = {os.getcwd(), os.environ.get("HOME", ""), tempfile.gettempdir(), "/tmp", "/dev/shm"}
    inside = [os.path.realpath(r) for r in roots if r]
    return (not (real == extensions or real.startswith(extensions + os.sep))
            and any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in inside))


def _path_digest(path: Path) -> str:
    """A file's content, or a directory's files (names and content), as one hash; a directory too
    large to read is keyed by its path (a new key in every child: then it compiles)."""
    if path.is_file():
        return _file_digest(str(path))
    files = sorted(p for p in path.rglob("*") if p.is_file())
    if len(files) > _MAX_FILES or sum(p.stat().st_size for p in files) > _MAX_BYTES:
        return str(path)
    h = hashlib.sha256()
    for p in files:
        h.update(f"{p.relative_to(path)}\0{_file_digest(str(p))}\0".encode())
    return h.hexdigest()


# -- records ----------------------------------------------------------------------------------------

def _read(entry: Path) -> dict[str, Any] | None:
    """The record of a key, or None (none yet, or one whose library is gone)."""
    try:
        record = json.loads((entry / _RECORD).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or ("failed" not in record and "module" not in record):
        return None
    if "module" in record and not (entry / str(record.get("file", ""))).is_file():
        return None
    return record


def _replay(record: dict[str, Any], entry: Path, call: dict[str, Any]) -> Any:
    """What the recorded build gave: its failure raised again, or its library imported."""
    from torch.utils import cpp_extension

    failed = record.get("failed")
    if isinstance(failed, dict):
        raise _exception(str(failed.get("type", "")), str(failed.get("message", "")))
    if call.get("is_standalone"):
        return str(entry / record["file"])
    return cpp_extension._import_module_from_library(record["module"], str(entry), call.get("is_python_module"))


def _exception(type_name: str, message: str) -> Exception:
    """The recorded failure as an exception of its own type where that is a built-in one (torch
    raises RuntimeError for a failed build), else RuntimeError."""
    cls = getattr(builtins, type_name, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(message)
        except Exception:
            pass
    return RuntimeError(message)


def _record_built(entry: Path, module: str, directory: str, standalone: bool) -> None:
    """Record the library a build step made: `module` is the name torch built it under (`name_vN`
    when a process builds one name twice)."""
    from torch.utils import cpp_extension

    built = (cpp_extension._get_exec_path(module, directory) if standalone
             else os.path.join(directory, f"{module}{cpp_extension.LIB_EXT}"))
    if os.path.isfile(built):
        _write(entry, {"module": module, "file": os.path.basename(built)}, built)


def _write(entry: Path, record: dict[str, Any], library: str | None = None) -> None:
    """Write a record whole or not at all (a folder renamed into place: the first writer of a key
    wins). The records are an optimisation: a failure to write one never fails the candidate."""
    if (entry / _RECORD).exists():
        return
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
        tmp.chmod(0o755)  # as torch leaves its build directories
        if library is not None:
            shutil.copy2(library, tmp / os.path.basename(library))
        (tmp / _RECORD).write_text(json.dumps(record))
        try:
            os.rename(tmp, entry)
        except OSError:  # another child recorded it meanwhile
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError:
        pass
