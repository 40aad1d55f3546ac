"""The child's side of attribution (`kbv.sandbox.own_kernels`), in this process: which shared objects
and Triton functions are the candidate's, by where they come from, as known before the candidate
ran. Triton cannot compile without a GPU here, so the kernels a function "compiled" are put in its
cache by hand."""

from __future__ import annotations

import importlib.util
import linecache
import mmap
import os
import shutil
import sys
import tempfile
import types
from pathlib import Path

import pytest

from kbv.sandbox.own_kernels import (
    Origin,
    Ownership,
    candidate_libraries,
    candidate_made,
    compiled_names,
    inductor_modules,
    mapped_files,
    own_kernels,
    ownership_at_start,
    record_triton_origins,
    triton_kernels,
)

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


@pytest.fixture
def origins(monkeypatch):
    """Where Triton functions are made, recorded from here on; Triton's constructor is restored after."""
    from triton.runtime.jit import JITFunction

    monkeypatch.setattr(JITFunction, "__init__", JITFunction.__init__)
    return record_triton_origins()


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


def _library_with_ptx(path: Path, kernel: str) -> Path:
    """An ELF file whose embedded PTX text defines `kernel`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(_elf().read_bytes() + f"\n.visible .entry {kernel}(\n)\n{{\n\tret;\n}}\n".encode())
    return path


def test_the_compilers_directories_are_the_ones_named_when_the_child_started(tmp_path, monkeypatch, origins):
    if not os.path.exists("/proc/self/maps"):
        pytest.skip("Linux's /proc")
    own = tmp_path / "work"
    monkeypatch.setenv("TMPDIR", str(own / "tmp"))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    start = ownership_at_start([str(own)])
    # Inductor's default, found without importing Inductor
    [inductor] = [Path(d) for d in start.compiler_dirs if Path(d).parent == (own / "tmp").resolve()]
    assert inductor.name.startswith("torchinductor_")
    # torch.compile wrote there; then the candidate points Inductor's cache, the temporary directory
    # and the user name elsewhere
    libraries = [_library_with_ptx(own / "ext" / "ext.so", "own_kernel"),
                 _library_with_ptx(inductor / "ab" / "cabc.so", "inductor_kernel")]
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "elsewhere"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("LOGNAME", "kbv_test_someone_else")
    maps = []
    try:
        for path in libraries:  # mapped, as a loaded library is
            with open(path, "rb") as f:
                maps.append(mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ))
        names = own_kernels(start, origins)
    finally:
        for m in maps:
            m.close()
    assert "own_kernel" in names and "inductor_kernel" not in names


def _module(path: Path, name: str, source: str) -> types.ModuleType:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compiled(jit, *names):
    """What Triton 3 keeps after a launch: the device's compiled kernels by key (then more)."""
    kernels = {f"key{i}": types.SimpleNamespace(name=n) for i, n in enumerate(names)}
    jit.device_caches[0] = (kernels, {}, None, None, None)


LAZY = KERNELS.replace("@triton.jit\n", "") + '''

class Model(torch.nn.Module):
    def forward(self, x):
        global lazy_kernel
        lazy_kernel = triton.jit({name})  # made at its first call, through torch's Module.__call__
        return x
'''


def test_triton_functions_are_the_candidates_by_where_they_were_made_never_by_name(tmp_path, monkeypatch, origins):
    import torch

    own, cache = tmp_path / "work", tmp_path / "work" / "triton"
    candidate_file = tmp_path / "build" / "candidate.py"
    candidate = _module(candidate_file, "kbv_candidate", KERNELS.format(name="relu_kernel"))
    monkeypatch.setitem(sys.modules, "kbv_candidate", candidate)
    helper = _module(own / "tmp" / "written.py", "kbv_test_written_kernels", KERNELS.format(name="scale_kernel"))
    cached = _module(cache / "cx" / "cxyz.py", "cxyz_cached", KERNELS.format(name="cached_kernel"))
    elsewhere = _module(tmp_path / "site" / "lib.py", "kbv_test_library_kernels", KERNELS.format(name="library_kernel"))
    lazy = _module(own / "tmp" / "lazy.py", "kbv_test_lazy_kernels", "import torch\n" + LAZY.format(name="lazy_fn"))
    lazy.Model()(torch.zeros(1))
    exec_own = _exec(monkeypatch, "kbv_candidate", "exec_kernel")  # exec'd into the candidate's module
    exec_other = _exec(monkeypatch, "kbv_test_exec_elsewhere", "exec_elsewhere_kernel")
    for jit in (candidate.relu_kernel, helper.scale_kernel, cached.cached_kernel, elsewhere.library_kernel,
                lazy.lazy_kernel, exec_own, exec_other):
        _compiled(jit, jit.fn.__name__)
    ownership = Ownership((str(own),), (str(cache),), str(candidate_file))
    names = triton_kernels(origins, ownership)
    assert names >= {"relu_kernel", "scale_kernel", "lazy_fn", "exec_kernel"}
    assert not names & {"cached_kernel", "library_kernel", "exec_elsewhere_kernel"}


def _exec(monkeypatch, module: str, kernel: str):
    """A Triton function exec'd from a string into a namespace named `module` (its source where
    `inspect` finds it, as Triton needs)."""
    source, filename = KERNELS.format(name=kernel), f"<exec {kernel}>"
    monkeypatch.setitem(linecache.cache, filename, (len(source), None, source.splitlines(True), filename))
    namespace = {"__name__": module}
    exec(compile(source, filename, "exec"), namespace)
    return namespace[kernel]


def test_a_librarys_triton_function_relabelled_afterwards_stays_the_librarys(tmp_path, monkeypatch, origins):
    own, candidate_file = tmp_path / "work", tmp_path / "build" / "candidate.py"
    library = _module(tmp_path / "site" / "lib.py", "kbv_test_library_kernels", KERNELS.format(name="library_kernel"))
    _compiled(library.library_kernel, "library_kernel")
    library.library_kernel.fn.__module__ = "kbv_candidate"
    library.library_kernel.module = "kbv_candidate"
    # the module the harness imported claims the library's file for its own
    monkeypatch.setitem(sys.modules, "kbv_candidate", types.SimpleNamespace(__file__=library.__file__))
    ownership = Ownership((str(own),), (), str(candidate_file))
    assert "library_kernel" not in triton_kernels(origins, ownership)


HIJACK = '''
from triton.runtime.jit import JITFunction

made = JITFunction.__init__


def hijack(self, *args, **kwargs):  # every Triton function is now made from this file
    made(self, *args, **kwargs)


JITFunction.__init__ = hijack
'''


def test_a_candidate_that_wraps_tritons_constructor_does_not_make_a_librarys_functions_its_own(
        tmp_path, monkeypatch, origins):
    candidate_file = tmp_path / "build" / "candidate.py"
    monkeypatch.setitem(sys.modules, "kbv_candidate", _module(candidate_file, "kbv_candidate", HIJACK))
    library = _module(tmp_path / "site" / "lib.py", "kbv_test_library_kernels", KERNELS.format(name="library_kernel"))
    _compiled(library.library_kernel, "library_kernel")
    own = _exec(monkeypatch, "kbv_candidate", "exec_kernel")  # its own, made through its wrapper too
    _compiled(own, "exec_kernel")
    names = triton_kernels(origins, Ownership((str(tmp_path / "work"),), (), str(candidate_file)))
    assert "exec_kernel" in names and "library_kernel" not in names


def test_a_triton_function_made_before_recording_began_is_not_the_candidates(tmp_path, monkeypatch):
    from triton.runtime.jit import JITFunction

    monkeypatch.setattr(JITFunction, "__init__", JITFunction.__init__)
    candidate_file = tmp_path / "candidate.py"
    candidate = _module(candidate_file, "kbv_candidate", KERNELS.format(name="early_kernel"))
    _compiled(candidate.early_kernel, "early_kernel")
    origins = record_triton_origins()
    assert not triton_kernels(origins, Ownership((str(tmp_path),), (), str(candidate_file)))


def test_inductors_generated_kernels_are_never_the_candidates_wherever_its_cache_is(tmp_path, monkeypatch, origins):
    from torch._inductor.codecache import PyCodeCache

    monkeypatch.setattr(PyCodeCache, "modules", [])
    monkeypatch.setattr(PyCodeCache, "modules_no_attr", {})
    own = tmp_path / "work"
    path = own / "tmp" / "redirected" / "ab" / "cabc.py"  # TORCHINDUCTOR_CACHE_DIR pointed into its own
    path.parent.mkdir(parents=True)
    path.write_text(KERNELS.format(name="triton_poi_fused_relu_0"))
    generated = PyCodeCache.load_by_key_path("cabc", str(path), set_sys_modules=False)
    _compiled(generated.triton_poi_fused_relu_0, "triton_poi_fused_relu_0")
    ownership = Ownership((str(own),), (), str(tmp_path / "candidate.py"))
    assert os.path.realpath(path) in inductor_modules()
    assert "triton_poi_fused_relu_0" not in triton_kernels(origins, ownership)
    PyCodeCache.cache_clear()  # torch ran the module: that is recorded with the function
    assert "triton_poi_fused_relu_0" not in triton_kernels(origins, ownership)
    # and a module in Inductor's code cache is torch's, whoever ran it
    made_here = Origin("k", str(path), "kbv_candidate", str(path), "kbv_candidate", by_torch=False)
    assert candidate_made(made_here, ownership)
    assert not candidate_made(made_here, ownership, generated=frozenset({str(path)}))


def test_a_triton_function_names_only_the_kernels_it_compiled_here(tmp_path, monkeypatch, origins):
    candidate_file = tmp_path / "candidate.py"
    candidate = _module(candidate_file, "kbv_candidate", KERNELS.format(name="never_launched"))
    monkeypatch.setitem(sys.modules, "kbv_candidate", candidate)
    ownership = Ownership((), (), str(candidate_file))
    assert "never_launched" not in triton_kernels(origins, ownership)  # an unlaunched decoy names nothing
    _compiled(candidate.never_launched, "never_launched", "never_launched_0d1d2de")  # Triton 2 suffixed its names
    assert {"never_launched", "never_launched_0d1d2de"} <= triton_kernels(origins, ownership)
    assert compiled_names(types.SimpleNamespace(), "k") == {"k"}  # a Triton whose caches we do not know
