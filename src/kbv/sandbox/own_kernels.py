"""Child side of attribution: the names of the kernels that are the candidate's own, found by where
they come from, never by what they are called.

- Shared objects: every file this process has mapped (`/proc/self/maps`: extensions built through
  `torch.utils.cpp_extension` and anything loaded with `ctypes`) that lies in the candidate's own
  directories (its work, temporary and extension build directories), less the outputs of the
  compilers torch and Triton run for themselves there (Triton's cache: launchers; Inductor's cache:
  `torch.compile`'s kernels). Their kernels are read from the files (`kbv.sandbox.elf`).
- Triton: every `JITFunction` made after the child started whose maker and whose function are both
  the candidate's (see `TritonOrigins`), named as the kernels it compiled in this process (a function
  never launched here names nothing).

Everything that says where the candidate's code lives is taken before the candidate runs: its
directories and the compilers' ones (`Ownership`, from the environment at child start), the file
the harness imported, and each Triton function's origin as it is made. A candidate that later
changes the environment, relabels a function or renames its module changes none of it.

The parent (`kbv.detect.attribution.attribute`) marks a profiled kernel the candidate's when its
name is one of these. This runs beside candidate code that could tamper with it: its answer is
evidence, like the rest of the reply.
"""

from __future__ import annotations

import functools
import getpass
import os
import sys
import sysconfig
import tempfile
import threading
import types
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kbv.sandbox.elf import kernel_entries

CANDIDATE_MODULE = "kbv_candidate"
MAX_NAMES = 20_000  # a reply's list of own kernel names is cut here
_MAX_NAME_CHARS = 4096


@dataclass(frozen=True)
class Ownership:
    """Where the candidate's own code lives, as the harness knew it before the candidate ran."""

    own_dirs: tuple[str, ...]  # its work, temporary and build directories
    compiler_dirs: tuple[str, ...]  # inside those, where torch's and Triton's compilers write: not its own
    candidate_file: str = ""  # the file the harness imported as `kbv_candidate`


def ownership_at_start(own_dirs: Sequence[str]) -> Ownership:
    """`own_dirs`, and the compilers' directories as this process's environment names them now: call
    it before the candidate is imported."""
    return Ownership(tuple(os.path.realpath(d) for d in own_dirs if d),
                     tuple(os.path.realpath(d) for d in compiler_dirs()))


def compiler_dirs() -> list[str]:
    """Where torch and Triton write their compilers' outputs, as this process's environment says now:
    Triton's cache and Inductor's, and Inductor's default (`torchinductor_<user>` in the temporary
    directory, worked out here: importing Inductor to ask it takes seconds)."""
    env = os.environ
    temps = {d for d in (env.get("TMPDIR", ""), tempfile.gettempdir()) if d}
    dirs = [env.get("TRITON_CACHE_DIR", ""), env.get("TORCHINDUCTOR_CACHE_DIR", "")]
    dirs += [os.path.join(t, "torchinductor_" + _user()) for t in sorted(temps)]
    return [d for d in dirs if d]


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no user name in the environment nor the password database (a dropped uid)
        return f"uid_{os.getuid()}"


def own_kernels(ownership: Ownership, origins: TritonOrigins) -> list[str]:
    """Kernel names of the candidate's shared objects and Triton functions (see the module
    docstring). Raises OSError where this process's mapped files cannot be listed."""
    # the environment now may add directories that are not the candidate's, never take one away
    ownership = replace(ownership, compiler_dirs=(*ownership.compiler_dirs, *_compiler_dirs_now()))
    names: set[str] = set()
    for path in candidate_libraries(mapped_files(), ownership.own_dirs, ownership.compiler_dirs):
        try:
            with open(path, "rb") as f:
                names |= kernel_entries(f.read())
        except (OSError, ValueError):  # gone, unreadable, or not an ELF image after all
            continue
    names |= triton_kernels(origins, ownership)
    return sorted(n[:_MAX_NAME_CHARS] for n in names)[:MAX_NAMES]


def _compiler_dirs_now() -> list[str]:
    try:
        return [os.path.realpath(d) for d in compiler_dirs()]
    except Exception:  # a temporary directory the candidate set to something else than a path
        return []


def mapped_files() -> list[str]:
    """Paths of the files this process has mapped (Linux). Raises OSError where /proc is not there:
    an empty list would disown every extension."""
    with open("/proc/self/maps") as f:
        lines = f.read().splitlines()
    paths = (line.split(maxsplit=5)[5] for line in lines if len(line.split(maxsplit=5)) == 6)
    return list(dict.fromkeys(p for p in paths if p.startswith("/")))


def candidate_libraries(paths: Iterable[str], own: Sequence[str], foreign: Sequence[str]) -> list[str]:
    """The ELF files among `paths` that lie in `own` directories and not in `foreign` ones."""
    out = []
    for path in dict.fromkeys(os.path.realpath(p.removesuffix(" (deleted)")) for p in paths):
        if _under(path, own) and not _under(path, foreign) and _is_elf(path):
            out.append(path)
    return out


# -- Triton ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Origin:
    """Where one Triton function came from, as it was made. `maker_*`: the code that made it (the
    first frame past Triton's own: where `@triton.jit` was applied); `code_*`: its Python function's
    code. A file is its real path where the file existed then, else "" (code exec'd from a string),
    and the module (the `__name__` of the code's globals) decides. `by_torch`: the maker is a module
    body that torch's code ran (Inductor loading the module it generated)."""

    name: str  # the function's name when it was made
    maker_file: str
    maker_module: str
    code_file: str
    code_module: str
    by_torch: bool


class TritonOrigins:
    """The origin of every Triton `JITFunction` made in this process since `record_triton_origins`:
    a function made before then, or whose origin was not recorded, is never the candidate's."""

    def __init__(self, torch_dir: str = "", triton_dir: str = "") -> None:
        self.torch_dir = os.path.join(torch_dir, "") if torch_dir else ""
        self.triton_dir = os.path.join(triton_dir, "") if triton_dir else ""
        self._stdlib = tuple({os.path.join(p, "") for k in ("stdlib", "platstdlib")
                              if (p := sysconfig.get_paths().get(k))})
        self._made: dict[int, tuple[weakref.ref[Any], Origin]] = {}
        self._lock = threading.RLock()  # a collection inside `record` calls `_forget` on this thread

    def record(self, jit: Any, frame: Any) -> None:
        """Note where `jit` was made; `frame`: the frame that called its constructor. The first
        record of a function stands."""
        origin = self._origin(jit, frame)
        key = id(jit)
        with self._lock:
            held = self._made.get(key)
            if held is None or held[0]() is not jit:
                self._made[key] = (weakref.ref(jit, functools.partial(self._forget, key)), origin)

    def _forget(self, key: int, ref: weakref.ref[Any]) -> None:
        with self._lock:
            if key in self._made and self._made[key][0] is ref:
                del self._made[key]

    def made(self) -> list[tuple[Any, Origin]]:
        """(function, origin) for each recorded function still alive."""
        with self._lock:
            held = list(self._made.values())
        return [(jit, origin) for ref, origin in held if (jit := ref()) is not None]

    def _origin(self, jit: Any, frame: Any) -> Origin:
        while frame is not None and self.triton_dir and frame.f_code.co_filename.startswith(self.triton_dir):
            frame = frame.f_back  # `triton.jit` and its decorator
        fn = vars(jit).get("fn")
        code = fn.__code__ if type(fn) is types.FunctionType else None
        return Origin(
            name=fn.__name__ if code is not None else "",
            maker_file=_real_file(frame.f_code.co_filename) if frame is not None else "",
            maker_module=_module_name(frame.f_globals) if frame is not None else "",
            code_file=_real_file(code.co_filename) if code is not None else "",
            code_module=_module_name(fn.__globals__) if code is not None else "",
            by_torch=frame is not None and self._run_by_torch(frame))

    def _run_by_torch(self, frame: Any) -> bool:
        """Whether `frame` is a module body whose nearest runner past the standard library (importlib
        included) is torch's code."""
        if frame.f_code.co_name != "<module>" or not self.torch_dir:
            return False
        caller = frame.f_back
        while caller is not None:
            filename = caller.f_code.co_filename
            if filename.startswith(self.torch_dir):  # first: torch may be installed inside the stdlib's tree
                return True
            if not (filename.startswith("<frozen ") or (self._stdlib and filename.startswith(self._stdlib))):
                return False
            caller = caller.f_back
        return False


def record_triton_origins() -> TritonOrigins:
    """From now on, record where each Triton `JITFunction` is made (its constructor is wrapped).
    Call it before the candidate is imported. Without Triton, nothing is recorded."""
    try:
        import torch
        import triton
        from triton.runtime.jit import JITFunction
    except Exception:
        return TritonOrigins()
    origins = TritonOrigins(os.path.dirname(torch.__file__), os.path.dirname(triton.__file__))
    made = JITFunction.__init__

    @functools.wraps(made)
    def __init__(jit: Any, *args: Any, **kwargs: Any) -> None:
        made(jit, *args, **kwargs)
        try:
            origins.record(jit, sys._getframe(1))
        except Exception:  # unrecorded: never the candidate's; its own code must not break on it
            pass

    JITFunction.__init__ = __init__  # type: ignore[method-assign]
    return origins


def triton_kernels(origins: TritonOrigins, ownership: Ownership) -> set[str]:
    """Kernel names of the candidate's Triton functions: those both made by the candidate and whose
    code is its own (see `Origin`), never one Inductor generated (its module body run by torch, or
    a module in Inductor's code cache)."""
    try:
        from triton.runtime.jit import JITFunction
    except Exception:
        return set()
    generated = inductor_modules()
    names: set[str] = set()
    for jit, origin in origins.made():
        # exact types only: a subclass's attributes would be its code, run here
        if type(jit) is JITFunction and candidate_made(origin, ownership, generated):
            try:
                names |= compiled_names(jit, origin.name)
            except Exception:  # caches the candidate filled with objects that raise: they name nothing
                continue
    return names


def candidate_made(origin: Origin, ownership: Ownership, generated: frozenset[str] = frozenset()) -> bool:
    """Whether a Triton function of `origin` is the candidate's: torch did not run its maker, and both
    its maker and its code are the candidate's (`generated`: the files of Inductor's modules)."""
    if origin.by_torch:
        return False
    return all(_candidates(file, module, ownership, generated)
               for file, module in ((origin.maker_file, origin.maker_module),
                                    (origin.code_file, origin.code_module)))


def _candidates(file: str, module: str, ownership: Ownership, generated: frozenset[str]) -> bool:
    if file:  # a real file decides: the harness's candidate file, or one in its own directories
        return (file not in generated and not _under(file, ownership.compiler_dirs)
                and (file == ownership.candidate_file or _under(file, ownership.own_dirs)))
    return module == CANDIDATE_MODULE or module.startswith(CANDIDATE_MODULE + ".")  # exec'd code


def inductor_modules() -> frozenset[str]:
    """The files of the modules Inductor generated and loaded in this process (`PyCodeCache`), as
    far as this torch keeps them; empty where Inductor was never imported."""
    cache = getattr(sys.modules.get("torch._inductor.codecache"), "PyCodeCache", None)
    try:
        by_path = getattr(cache, "modules_no_attr", None)  # path -> module
        files = set(by_path) if isinstance(by_path, dict) else set()
        for held in (getattr(cache, "modules", None), by_path, getattr(cache, "cache", None)):  # `cache`: older torch
            modules = held.values() if isinstance(held, dict) else held if isinstance(held, list) else ()
            files |= {vars(m).get("__file__") for m in modules if type(m) is types.ModuleType}
        return frozenset(os.path.realpath(f) for f in files if isinstance(f, str))
    except Exception:  # a cache the candidate emptied or broke: that torch ran the module still tells
        return frozenset()


def compiled_names(jit: object, fallback: str) -> set[str]:
    """The names of the kernels `jit` (a Triton JITFunction) compiled in this process, as the device
    names them; `{fallback}` where this Triton keeps its compiled kernels where we do not look."""
    state = vars(jit)
    caches = state.get("device_caches")  # Triton 3: device -> (kernels by key, ...)
    if isinstance(caches, dict):
        tables = [entry[0] for entry in caches.values() if isinstance(entry, tuple) and entry]
    elif isinstance(state.get("cache"), dict):  # Triton 2: device -> kernels by key
        tables = list(state["cache"].values())
    else:
        return {fallback} if fallback else set()
    names = set()
    for table in tables:
        for kernel in table.values() if isinstance(table, dict) else ():
            name = getattr(kernel, "name", None)
            if not isinstance(name, str):
                metadata = getattr(kernel, "metadata", None)
                name = metadata.get("name") if isinstance(metadata, dict) else getattr(metadata, "name", None)
            if isinstance(name, str):
                names.add(name)
    return names


def _real_file(filename: str) -> str:
    """The real path of `filename` where it is a file that exists, else ""."""
    return os.path.realpath(filename) if os.path.isfile(filename) else ""


def _module_name(namespace: Mapping[str, Any]) -> str:
    name = namespace.get("__name__")
    return name if isinstance(name, str) else ""


def _under(path: str, dirs: Sequence[str]) -> bool:
    return any(path == d or path.startswith(d.rstrip(os.sep) + os.sep) for d in dirs)


def _is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False
