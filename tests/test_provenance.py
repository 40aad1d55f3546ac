"""The child's side of attribution (`kbv.sandbox.provenance`), in this process: which shared objects
and Triton functions are the candidate's, by where they come from. Triton cannot compile without a
GPU here, so the kernels a function "compiled" are put in its cache by hand."""

from __future__ import annotations

import importlib.util
import linecache
import os
import shutil
import sys
import types
from pathlib import Path

import pytest

from kbv.sandbox.provenance import candidate_libraries, compiled_names, mapped_files, triton_kernels

triton = pytest.importorskip("triton")

KERNELS = '''
import triton
import triton.language as tl


@triton.jit
def {name}(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)
'''


def _elf() -> Path:
    return Path(os.path.realpath(sys.executable))  # any ELF file will do


def test_only_elf_files_in_the_candidates_directories_less_torch_and_tritons_caches_are_its(tmp_path):
    own, cache = tmp_path / "work", tmp_path / "work" / "triton"
    (own / "ext").mkdir(parents=True)
    cache.mkdir()
    shutil.copy(_elf(), own / "ext" / "ext.so")
    shutil.copy(_elf(), cache / "launcher.so")
    (own / "notes.so").write_text("not an ELF file")
    paths = [str(own / "ext" / "ext.so"), str(cache / "launcher.so"), str(own / "notes.so"), str(_elf()),
             str(own / "ext" / "gone.so") + " (deleted)"]
    assert candidate_libraries(paths, [str(own)], [str(cache)]) == [str(own / "ext" / "ext.so")]


def test_the_processs_mapped_files_are_listed():
    if not os.path.exists("/proc/self/maps"):
        pytest.skip("Linux's /proc")
    assert str(_elf()) in {os.path.realpath(p) for p in mapped_files()}


def _module(path: Path, name: str, kernel: str) -> types.ModuleType:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(KERNELS.format(name=kernel))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compiled(jit, *names):
    """What Triton 3 keeps after a launch: the device's compiled kernels by key (then more)."""
    kernels = {f"key{i}": types.SimpleNamespace(name=n) for i, n in enumerate(names)}
    jit.device_caches[0] = (kernels, {}, None, None, None)


def test_triton_functions_are_the_candidates_by_their_module_or_file_never_by_name(tmp_path, monkeypatch):
    own, inductor = tmp_path / "work", tmp_path / "work" / "tmp" / "torchinductor_x"
    candidate = _module(tmp_path / "build" / "candidate.py", "kbv_candidate", "relu_kernel")
    monkeypatch.setitem(sys.modules, "kbv_candidate", candidate)
    helper = _module(own / "tmp" / "written.py", "kbv_test_written_kernels", "scale_kernel")
    generated = _module(inductor / "cx" / "cxyz.py", "cxyz_generated", "triton_poi_fused_relu_0")
    elsewhere = _module(tmp_path / "site" / "lib.py", "kbv_test_library_kernels", "library_kernel")
    exec_own = _exec(monkeypatch, "kbv_candidate", "exec_kernel")  # exec'd into the candidate's module
    exec_other = _exec(monkeypatch, "kbv_test_exec_elsewhere", "exec_elsewhere_kernel")
    for jit in (candidate.relu_kernel, helper.scale_kernel, generated.triton_poi_fused_relu_0,
                elsewhere.library_kernel, exec_own, exec_other):
        _compiled(jit, jit.fn.__name__)
    names = triton_kernels([str(own)], [str(inductor)])
    assert names >= {"relu_kernel", "scale_kernel", "exec_kernel"}
    assert not names & {"triton_poi_fused_relu_0", "library_kernel", "exec_elsewhere_kernel"}


def _exec(monkeypatch, module: str, kernel: str):
    """A Triton function exec'd from a string into a namespace named `module` (its source where
    `inspect` finds it, as Triton needs)."""
    source, filename = KERNELS.format(name=kernel), f"<exec {kernel}>"
    monkeypatch.setitem(linecache.cache, filename, (len(source), None, source.splitlines(True), filename))
    namespace = {"__name__": module}
    exec(compile(source, filename, "exec"), namespace)
    return namespace[kernel]


def test_a_triton_function_names_only_the_kernels_it_compiled_here(tmp_path, monkeypatch):
    candidate = _module(tmp_path / "candidate.py", "kbv_candidate", "never_launched")
    monkeypatch.setitem(sys.modules, "kbv_candidate", candidate)
    assert "never_launched" not in triton_kernels([], [])  # an unlaunched decoy names nothing
    _compiled(candidate.never_launched, "never_launched", "never_launched_0d1d2de")  # Triton 2 suffixed its names
    assert {"never_launched", "never_launched_0d1d2de"} <= triton_kernels([], [])
    assert compiled_names(types.SimpleNamespace(), "k") == {"k"}  # a Triton whose caches we do not know
