"""Child side of attribution: the names of the kernels that are the candidate's own, found by where
they come from, never by what they are called.

- Shared objects: every file this process has mapped (`/proc/self/maps`: extensions built through
  `torch.utils.cpp_extension` and anything loaded with `ctypes`) that lies in the candidate's own
  directories (its work, temporary and extension build directories), less the outputs of the
  compilers torch and Triton run for themselves there (Triton's cache: launchers; Inductor's cache:
  `torch.compile`'s kernels). Their kernels are read from the files (`kbv.sandbox.elf`).
- Triton: every `JITFunction` in the process whose Python function was defined by the candidate (its
  module `kbv_candidate`, code exec'd into that module, or a file in its own directories, Inductor's
  cache excepted), named as the kernels it compiled in this process (a function never launched here
  names nothing).

The parent (`kbv.detect.attribution.attribute`) marks a profiled kernel the candidate's when its
name is one of these. This runs beside candidate code that could tamper with it: its answer is
evidence, like the rest of the reply.
"""

from __future__ import annotations

import gc
import os
import sys
import types
from collections.abc import Iterable, Sequence

from kbv.sandbox.elf import kernel_entries

CANDIDATE_MODULE = "kbv_candidate"
MAX_NAMES = 20_000  # a reply's list of own kernel names is cut here
_MAX_NAME_CHARS = 4096


def own_kernels(own_dirs: Sequence[str]) -> list[str]:
    """Kernel names of the candidate's shared objects and Triton functions (see the module
    docstring). `own_dirs`: the candidate's own directories, as known before it was imported.
    Raises OSError where this process's mapped files cannot be listed."""
    own = [os.path.realpath(d) for d in own_dirs if d]
    foreign = [os.path.realpath(d) for d in not_own_dirs()]
    names: set[str] = set()
    for path in candidate_libraries(mapped_files(), own, foreign):
        try:
            with open(path, "rb") as f:
                names |= kernel_entries(f.read())
        except (OSError, ValueError):  # gone, unreadable, or not an ELF image after all
            continue
    names |= triton_kernels(own, foreign)
    return sorted(n[:_MAX_NAME_CHARS] for n in names)[:MAX_NAMES]


def not_own_dirs() -> list[str]:
    """Directories inside the candidate's own where torch and Triton write their compilers' outputs:
    Triton's cache and, once torch.compile has been used, Inductor's."""
    dirs = [os.environ.get("TRITON_CACHE_DIR", ""), os.environ.get("TORCHINDUCTOR_CACHE_DIR", "")]
    inductor = sys.modules.get("torch._inductor.runtime.cache_dir_utils")
    if inductor is not None and not dirs[1]:  # never imported: torch.compile generated nothing here
        try:
            dirs.append(str(inductor.default_cache_dir()))  # not `cache_dir()`: it creates the directory
        except Exception:  # the default needs a user name
            pass
    return [d for d in dirs if d]


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


def triton_kernels(own: Sequence[str], foreign: Sequence[str]) -> set[str]:
    """Kernel names of the candidate's Triton functions (see the module docstring)."""
    try:
        from triton.runtime.jit import JITFunction
    except Exception:
        return set()
    module = sys.modules.get(CANDIDATE_MODULE)
    candidate_file = vars(module).get("__file__") if type(module) is types.ModuleType else None
    files = {os.path.realpath(candidate_file)} if isinstance(candidate_file, str) else set()
    # exact types only: `isinstance` would ask a candidate object for its `__class__` (its code, run here)
    jits = [o for o in gc.get_objects() if type(o) is JITFunction]
    names: set[str] = set()
    for jit in jits:
        fn = vars(jit).get("fn")
        if type(fn) is types.FunctionType and _defined_by_candidate(fn, own, foreign, files):
            names |= compiled_names(jit, fn.__name__)
    return names


def _defined_by_candidate(fn: types.FunctionType, own: Sequence[str], foreign: Sequence[str],
                          candidate_files: set[str]) -> bool:
    filename = fn.__code__.co_filename
    path = os.path.realpath(filename) if os.path.isabs(filename) else ""  # "<string>": exec'd, its module decides
    if _under(path, foreign):  # Inductor's generated modules: torch's kernels
        return False
    module = fn.__module__ if isinstance(fn.__module__, str) else ""
    return (module == CANDIDATE_MODULE or module.startswith(CANDIDATE_MODULE + ".") or path in candidate_files
            or (bool(path) and _under(path, own)))


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
        return {fallback}
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


def _under(path: str, dirs: Sequence[str]) -> bool:
    return any(path == d or path.startswith(d.rstrip(os.sep) + os.sep) for d in dirs)


def _is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False
