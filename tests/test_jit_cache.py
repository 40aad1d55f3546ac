"""What a candidate builds at import is recorded once and found after (`kbv.sandbox.jit_cache`): the key
is what a call compiles, not where its sources lie; a later call of the key imports the recorded build,
or raises the recorded failure, without running the build step. Fakes stand in for torch's two steps
here (no compiler); `tests/test_builds.py` builds real extensions through the sandbox."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from kbv.sandbox import jit_cache


def _call(sources: list[Path], **overrides: Any) -> dict[str, Any]:
    call = {"name": "ext", "sources": [str(s) for s in sources], "extra_cflags": ["-O3"], "extra_cuda_cflags": None,
            "extra_sycl_cflags": None, "extra_ldflags": None, "extra_include_paths": None,
            "build_directory": "/nowhere", "verbose": False, "with_cuda": None, "with_sycl": None,
            "is_python_module": True, "is_standalone": False}
    return {**call, **overrides}


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_the_key_is_what_is_compiled_not_where_it_lies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the child's scratch: its working directory
    first = _write(tmp_path / "a" / "relu.cpp", "int relu;")
    again = _write(tmp_path / "b" / "other_name.cpp", "int relu;")
    os.utime(again, (1, 1))
    key = jit_cache.jit_key
    assert key(_call([first])) == key(_call([again]))  # another directory, name and mtime
    assert key(_call([first])) != key(_call([_write(tmp_path / "c" / "relu.cpp", "int relu2;")]))
    assert key(_call([first])) != key(_call([first], extra_cflags=["-O2"]))
    assert key(_call([first])) != key(_call([first], name="ext2"))
    assert key(_call([first])) != key(_call([_write(tmp_path / "d" / "relu.cu", "int relu;")]))
    # a header beside a source, and an include directory of its own scratch, are keyed by content
    _write(tmp_path / "a" / "common.h", "#define N 1")
    _write(tmp_path / "b" / "common.h", "#define N 1")
    assert key(_call([first])) == key(_call([again]))
    _write(tmp_path / "b" / "common.h", "#define N 2")
    assert key(_call([first])) != key(_call([again]))
    inc = [_write(tmp_path / d / "inc" / "k.h", "#define K 1").parent for d in ("a", "b")]
    assert key(_call([first], extra_cflags=[f"-I{inc[0]}"])) == key(_call([first], extra_cflags=[f"-I{inc[1]}"]))


class _Torch:
    """torch's `_jit_compile` and its build step, faked: the build writes `name` into the build
    directory, or fails as torch's does; `builds` counts the build steps run."""

    def __init__(self, fail: bool, refuse: bool = False, why: str = "error: 'kbv_undeclared_symbol' was not declared") -> None:
        self.fail = fail
        self.why = why
        self.refuse = refuse  # fail before the build step, as torch does for arguments it refuses
        self.builds = 0
        self.build = jit_cache._noting(self._build)

    def _build(self, name: str, sources: list[str], build_directory: str, is_standalone: bool = False) -> None:
        self.builds += 1
        if self.fail:
            raise RuntimeError(f"Error building extension '{name}': {self.why}")
        _write(Path(build_directory) / name, "#!/bin/sh\n")

    def compile(self, name: str, sources: list[str], extra_cflags: Any, extra_cuda_cflags: Any,
                extra_sycl_cflags: Any, extra_ldflags: Any, extra_include_paths: Any, build_directory: str,
                verbose: bool, with_cuda: Any, with_sycl: Any, is_python_module: bool, is_standalone: bool,
                keep_intermediates: bool = True) -> str:
        if self.refuse:
            raise ValueError("`is_python_module` and `is_standalone` are mutually exclusive.")
        self.build(name=name, sources=sources, build_directory=build_directory, is_standalone=is_standalone)
        return os.path.join(build_directory, name)


def _compile(torch: _Torch, root: Path, source: Path, build_directory: Path) -> Any:
    cached = jit_cache._cached(torch.compile, root)
    return cached(**_call([source], build_directory=str(build_directory), is_standalone=True))


def test_a_recorded_build_is_found_and_never_built_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One child builds and records; the next (its sources in a directory of its own, its build
    directory elsewhere) gets the recorded build without a build step."""
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "torch_extensions" / jit_cache.CACHE_DIR
    builder, evaluator = _Torch(fail=False), _Torch(fail=False)
    built = _compile(builder, root, _write(tmp_path / "one" / "x.cpp", "int x;"), tmp_path / "one" / "build")
    found = _compile(evaluator, root, _write(tmp_path / "two" / "y.cpp", "int x;"), tmp_path / "two" / "build")
    assert (builder.builds, evaluator.builds) == (1, 0)
    assert Path(built).read_text() == Path(found).read_text() and Path(found).parent.parent == root


def test_a_recorded_failure_is_raised_again_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same type and message as the build's own failure (a candidate's check of it passes), and
    no build step."""
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "torch_extensions" / jit_cache.CACHE_DIR
    builder, evaluator = _Torch(fail=True), _Torch(fail=False)
    with pytest.raises(RuntimeError) as first:
        _compile(builder, root, _write(tmp_path / "one" / "x.cpp", "int x;"), tmp_path / "one" / "build")
    with pytest.raises(RuntimeError) as again:
        _compile(evaluator, root, _write(tmp_path / "two" / "x.cpp", "int x;"), tmp_path / "two" / "build")
    assert str(again.value) == str(first.value) and "Error building extension 'ext'" in str(again.value)
    assert (builder.builds, evaluator.builds) == (1, 0)


def test_a_failure_other_than_the_builds_own_is_not_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A call that fails before its build step (or a library that fails to import) leaves no failure
    to replay: the next call runs the build step itself."""
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "torch_extensions" / jit_cache.CACHE_DIR
    source = _write(tmp_path / "x.cpp", "int x;")

    with pytest.raises(ValueError):
        _compile(_Torch(fail=False, refuse=True), root, source, tmp_path / "b")
    later = _Torch(fail=False)
    _compile(later, root, source, tmp_path / "b")
    assert later.builds == 1


def test_a_failure_the_machine_caused_is_not_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A compiler killed on a busy build pool fails this build, not every later one: the next call builds."""
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "torch_extensions" / jit_cache.CACHE_DIR
    source = _write(tmp_path / "x.cpp", "int x;")
    killed = _Torch(fail=True, why="c++: fatal error: Killed signal terminated program cc1plus")
    with pytest.raises(RuntimeError):
        _compile(killed, root, source, tmp_path / "b")
    later = _Torch(fail=False)
    _compile(later, root, source, tmp_path / "b")
    assert later.builds == 1
