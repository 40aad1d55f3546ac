"""Precompiled torch headers for extension builds: the C++ compiler that builds' children use.

Measured on one `load_inline` CUDA candidate (`bench/builds.py` prints it per candidate): almost all
of a build's CPU-seconds go to parsing torch's headers, once by `c++` for the bindings (`main.cpp`,
which begins with `#include <torch/extension.h>`) and three times by nvcc for the kernels' file
(cudafe++, cicc, the host compiler); the device code itself takes well under a second. nvcc has no
precompiled headers, so the kernels' file is compiled as KernelBench compiles it, untouched. The
bindings' file is where the saving is: its `torch/extension.h` is parsed once per toolchain and flag
set, into a GCC precompiled header shared by every later build, instead of once per candidate.

How: children run with `CXX` set to a small script that runs `python -m kbv.pch ARGS...` (`compile_env`).
For a compile of one C++ file that begins with `#include <torch/extension.h>`, this finds (or builds)
the header precompiled with exactly that command's flags (all of them but the file, its outputs and
`-DTORCH_EXTENSION_NAME`, which the header never reads), and adds `-I DIR` so that GCC finds
`DIR/torch/extension.h.gch` before the header. Everything else (links, `-v` probes, nvcc's host
compiler, other files) reaches the real compiler unchanged. GCC checks a precompiled header against
the command that uses it and ignores one that does not match, so a wrong one can slow a build but
never change it; the object code is the same (`bench/builds.py` compares it).

Sharing: one directory per variant under `$cache/pch/<key>`, the key a hash of the compiler (path,
size, mtime), the header (path, mtime) and the flags: installations of kbv that share a cache share a
variant only where all of these are the same. The compiler script names an interpreter and a kbv
source, so each installation has its own (`$cache/pch/installs/<installation_key>/kbv-cxx`), with its
own warm-up builds beside it: another installation that writes its script meanwhile, with an
interpreter this one's sandbox cannot see, never changes the compiler of this one's builds. Only a
trusted process makes variants (`KBV_PCH_MAKE` set: `warm`, run by the build pool, which builds
trivial extensions of kbv's own with load_inline's default flags, the flags most candidates build
with). A candidate's build runs in the sandbox, where the directory is read-only: it uses a variant
that is there and compiles without one that is not, and can neither plant a header nor change the
compiler script that every later build would use. A finished header is renamed into place, then
marked `ok`; a failed one is marked `failed` and not tried again. At most `MAX_VARIANTS` variants
are made (each is some 0.8 GB).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HEADER = "torch/extension.h"
MAX_VARIANTS = 4
_SOURCES = (".cpp", ".cc", ".cxx", ".C")
_WITH_VALUE = ("-o", "-MF", "-MT", "-MQ")  # options of one unit whose value follows
_ALONE = ("-c", "-MMD", "-MD")


@dataclass(frozen=True)
class Unit:
    """A compile of one C++ file that can use the precompiled header."""

    source: str
    flags: tuple[str, ...]  # every option but the unit's own, in order
    header: Path  # the torch/extension.h its include path finds


def installation_key() -> str:
    """This installation of kbv, as a short hash of its interpreter, the directory it imports kbv
    from and its version: what it keeps in a shared cache that names any of these is its own."""
    from kbv import __version__

    parts = [sys.executable, str(_source_dir()), __version__]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def _source_dir() -> Path:
    """The directory this kbv is imported from (the one that holds the package)."""
    return Path(__file__).resolve().parents[1]


def _own_dir(root: Path) -> Path:
    """This installation's directory under the shared `root`: its compiler script, its warm-up builds."""
    return root / "installs" / installation_key()


def compile_env(cache_dir: Path) -> dict[str, str]:
    """The variables that give a child's extension builds the shared precompiled header, through
    this installation's compiler script."""
    root = cache_dir / "pch"
    own = _own_dir(root)
    own.mkdir(parents=True, exist_ok=True)
    script = own / "kbv-cxx"
    from kbv.sandbox.isolation import interpreter

    # the script runs this kbv with this interpreter (as a sandboxed build sees it), whatever PYTHONPATH the build has
    source = shlex.quote(str(_source_dir()))
    text = ("#!/bin/sh\n# kbv's C++ compiler for extension builds: precompiled torch headers (kbv.pch)\n"
            f'export PYTHONPATH={source}${{PYTHONPATH:+:"$PYTHONPATH"}}\n'
            f'exec {shlex.quote(interpreter())} -m kbv.pch "$@"\n')
    if not script.exists() or script.read_text() != text:
        # threads of one process and other processes of this installation may all write it at once:
        # each its own file
        fd, tmp = tempfile.mkstemp(prefix=".kbv-cxx.", dir=own)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o755)
        os.replace(tmp, script)
    real = os.environ.get("KBV_REAL_CXX") or os.environ.get("CXX") or "c++"
    return {"CXX": str(script), "KBV_REAL_CXX": real, "KBV_PCH_DIR": str(root)}


def parse_unit(args: list[str]) -> Unit | None:
    """`args` as a Unit when they compile one C++ file beginning with `#include <torch/extension.h>`."""
    if "-c" not in args:
        return None
    sources, flags, skip = [], [], False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg in _WITH_VALUE:
            skip = True
        elif arg in _ALONE or arg.startswith("-DTORCH_EXTENSION_NAME="):
            continue
        elif not arg.startswith("-") and arg.endswith(_SOURCES):
            sources.append(arg)
        else:
            flags.append(arg)
    if len(sources) != 1 or not _begins_with_header(Path(sources[0])):
        return None
    header = _find_header(flags)
    return Unit(sources[0], tuple(flags), header) if header is not None else None


def _begins_with_header(source: Path) -> bool:
    try:
        with source.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.strip():
                    return line.split("//")[0].strip().replace(" ", "") == f"#include<{HEADER}>"
    except OSError:
        return False
    return False


def _find_header(flags: list[str]) -> Path | None:
    """The torch/extension.h that the unit's include path finds first (-I, then -isystem)."""
    found: dict[str, list[str]] = {"-I": [], "-isystem": []}
    i = 0
    while i < len(flags):
        for option in found:
            if flags[i] == option and i + 1 < len(flags):
                found[option].append(flags[i + 1])
                i += 1
                break
            if flags[i].startswith(option) and flags[i] != option:
                found[option].append(flags[i][len(option):])
                break
        i += 1
    for d in found["-I"] + found["-isystem"]:
        path = Path(d) / HEADER
        if path.is_file():
            return path.resolve()
    return None


def variant_key(compiler: str, unit: Unit) -> str:
    """What a precompiled header depends on: the compiler binary, the header, the flags."""
    import shutil

    resolved = shutil.which(compiler) or compiler
    parts: list[object] = [os.path.realpath(resolved), list(unit.flags), str(unit.header)]
    for path in (os.path.realpath(resolved), str(unit.header)):
        with contextlib.suppress(OSError):
            st = os.stat(path)
            parts.append([st.st_size, st.st_mtime_ns])
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:20]


def ensure_pch(root: Path, compiler: str, unit: Unit, make: bool = False) -> Path | None:
    """The include directory holding the precompiled header for `unit`; with `make` (a trusted
    process), built now if it is the first to need it. None where there is none to use (not made,
    being made, failed, or MAX_VARIANTS there already)."""
    variant = root / variant_key(compiler, unit)
    if (variant / "ok").exists():
        return variant
    if not make or (variant / "failed").exists():
        return None
    if sum(1 for d in root.iterdir() if (d / "ok").exists()) >= MAX_VARIANTS:
        return None
    (variant / "torch").mkdir(parents=True, exist_ok=True)
    with open(variant / ".lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None  # being made by another build: this one compiles as it would without
        if (variant / "ok").exists():
            return variant
        for stale in (variant / "torch").glob(".extension.h.gch.*"):  # a build killed while making it
            with contextlib.suppress(OSError):
                stale.unlink()
        return variant if _build(variant, compiler, unit) else None


def _build(variant: Path, compiler: str, unit: Unit) -> bool:
    if not _is_gcc(compiler):  # only GCC looks for DIR/name.gch on its include path
        (variant / "failed").write_text("not GCC\n")
        return False
    target = variant / "torch" / "extension.h.gch"
    tmp = target.with_name(f".extension.h.gch.{os.getpid()}")
    cmd = [compiler, "-x", "c++-header", str(unit.header), "-o", str(tmp), *unit.flags]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, errors="replace")
    if proc.returncode != 0:
        with contextlib.suppress(OSError):
            tmp.unlink()
        (variant / "failed").write_text(json.dumps({"command": cmd, "stderr": proc.stderr[-4000:]}))
        return False
    os.replace(tmp, target)
    # a later `#include <torch/extension.h>` of the same unit finds this directory first, and GCC
    # then reads the header beside the precompiled one (which serves the first include only)
    (variant / HEADER).write_text("// kbv: torch/extension.h, for includes its precompiled form (beside) cannot serve\n"
                                  "#pragma once\n#include_next <torch/extension.h>\n")
    (variant / "ok").write_text(json.dumps({"command": cmd, "wall_s": round(time.monotonic() - t0, 2)}))
    return True


def _is_gcc(compiler: str) -> bool:
    try:
        out = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "Free Software Foundation" in out and "clang" not in out.lower()


WARM_CPP = "torch::Tensor kbv_warm(torch::Tensor x) { return x; }"
WARM_CUDA = "__global__ void kbv_warm_kernel(float* x) { x[threadIdx.x] = 0.0f; }"


def warm(cache_dir: Path, arch_list: str | None, timeout_s: float = 900.0) -> list[str]:
    """Make the precompiled headers for load_inline's default flags, C++-only and with CUDA, by
    building two trivial extensions of kbv's own in a process of its own (trusted: no candidate code
    runs in it). Returns what could not be made, in one line each (a machine without a CUDA build of
    torch makes the C++ one only; a missing compiler makes none: builds then compile as without)."""
    root = cache_dir / "pch"
    env = {**os.environ, **compile_env(cache_dir), "KBV_PCH_MAKE": "1",
           "TORCH_EXTENSIONS_DIR": str(_own_dir(root) / "warm")}  # its build files name its script
    if arch_list:
        env["TORCH_CUDA_ARCH_LIST"] = arch_list
    program = ("import sys, torch\n"
               "from torch.utils.cpp_extension import load_inline\n"
               "cuda = sys.argv[1] == 'cuda'\n"
               f"load_inline('kbv_pch_warm_' + sys.argv[1], {WARM_CPP!r}, cuda_sources={WARM_CUDA!r} if cuda else None,\n"
               "            functions=['kbv_warm'], verbose=False)\n")
    missing = []
    kinds = ["cpp"] + (["cuda"] if _has_cuda_toolkit() else [])
    for kind in kinds:
        try:
            done = subprocess.run([sys.executable, "-c", program, kind], env=env, capture_output=True, text=True,
                                  timeout=timeout_s)
            if done.returncode != 0 and not _made(root, kind):
                missing.append(f"{kind}: {(done.stderr.strip().splitlines() or ['failed'])[-1][:200]}")
        except (OSError, subprocess.SubprocessError) as exc:
            missing.append(f"{kind}: {exc}"[:200])
    return missing


def _has_cuda_toolkit() -> bool:
    import shutil

    import torch

    return torch.version.cuda is not None and shutil.which("nvcc") is not None


def _made(root: Path, kind: str) -> bool:
    """Whether a variant exists (a CUDA warm-up compiles its bindings, hence the header, before the link
    that a CPU-only torch fails)."""
    return any((d / "ok").exists() for d in root.iterdir() if d.is_dir()) if root.is_dir() else False


def main(argv: list[str]) -> None:
    """`python -m kbv.pch ARGS...`: run the real compiler on ARGS, with the precompiled header where
    ARGS compile a unit that can use it."""
    real = os.environ.get("KBV_REAL_CXX") or "c++"
    root = os.environ.get("KBV_PCH_DIR")
    args = list(argv)
    if root:
        unit = parse_unit(args)
        if unit is not None:
            try:
                include = ensure_pch(Path(root), real, unit, make=bool(os.environ.get("KBV_PCH_MAKE")))
            except OSError:  # an unwritable cache: build as without
                include = None
            if include is not None:
                args = ["-I", str(include), *args]
    os.execvp(real, [real, *args])


if __name__ == "__main__":
    main(sys.argv[1:])
