"""The build stage (`kbv.builds`, `kbv.pch`): a build runs where and how the pool says (build cores,
lowest priority, ninja's share of the CPUs, the compiler wrapper) and its CPU-seconds are measured;
the bindings file of a C++ extension uses the shared precompiled torch header, and its object code
is the one it has without; which compiles can use the header at all."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from kbv.builds import BuildPool, build_candidate
from kbv.candidates import Candidate, Pair
from kbv.pch import parse_unit
from kbv.placement import BUILD_NICE, CorePlan, Isolation
from kbv.problems import Problem
from kbv.settings import Settings
from sources import CPP_RELU

# A "build" that compiles nothing: the regex that makes it a C++ candidate matches the comment. At
# import, it writes down where and how it runs.
PROBE = '''\
# cpp_sources = (none: this candidate reports how its build runs)
import json, os
os.makedirs(os.environ["TORCH_EXTENSIONS_DIR"], exist_ok=True)
with open(os.path.join(os.environ["TORCH_EXTENSIONS_DIR"], "probe.json"), "w") as f:
    json.dump({"nice": os.getpriority(os.PRIO_PROCESS, 0), "cpus": sorted(os.sched_getaffinity(0)),
               "max_jobs": os.environ.get("MAX_JOBS"), "cxx": os.environ.get("CXX")}, f)
t = __import__("time").process_time()
while __import__("time").process_time() - t < 0.5:
    pass
'''


def _pair(code: str, name: str) -> Pair:
    problem = Problem(name="19_ReLU", level=1, problem_id=19, code="# p\n", origin="19_ReLU.py")
    return Pair(problem, Candidate(code=code, name=name, origin=f"{name}.py", problem_ref="19_ReLU"))


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="affinity is Linux's")
def test_a_build_runs_on_the_build_cpus_at_the_lowest_priority_with_its_share_of_them(tmp_path: Path) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    plan = CorePlan(Isolation.PIN, (frozenset(cpus[-1:]),), frozenset(cpus), len(cpus))
    settings = Settings(device="cpu", run_dir=tmp_path / "run", cache_dir=tmp_path / "cache", jobs=1)
    pool = BuildPool(settings, plan)
    try:
        build = pool.start(_pair(PROBE, "19_ReLU__probe")).result(timeout=120)
    finally:
        pool.shutdown(wait=True)
    probe = json.loads((build.build_dir / "torch_extensions" / "probe.json").read_text())
    assert probe["nice"] == BUILD_NICE and probe["cpus"] == cpus
    assert probe["max_jobs"] == str(min(4, len(cpus)))  # one build in flight: all its CPUs, at most 4
    assert probe["cxx"] == str(tmp_path / "cache" / "pch" / "kbv-cxx")
    assert build.status is None and build.cpu_s >= 0.5  # the child's own CPU-seconds, measured
    state = pool.state()
    assert (state.done, state.cached, state.running, state.queued) == (1, 0, 0, 0) and state.cpu_s >= 0.5
    again = build_candidate(_pair(PROBE, "19_ReLU__probe").candidate, settings, "again")
    assert again.cached and again.cpu_s == build.cpu_s  # found built: what it cost then


def test_only_a_compile_of_one_file_that_begins_with_the_torch_header_can_use_it(tmp_path: Path) -> None:
    torch_include = tmp_path / "include"
    (torch_include / "torch").mkdir(parents=True)
    (torch_include / "torch" / "extension.h").write_text("#pragma once\n")
    main = tmp_path / "main.cpp"
    main.write_text("#include <torch/extension.h>\nint f() { return 1; }\n")
    other = tmp_path / "other.cpp"
    other.write_text("#include <vector>\n#include <torch/extension.h>\n")
    flags = f"-DTORCH_API_INCLUDE_EXTENSION_H -isystem {torch_include} -fPIC -std=c++20 -O3"
    unit = parse_unit(shlex.split(f"-MMD -MF main.o.d -DTORCH_EXTENSION_NAME=ext {flags} -c {main} -o main.o"))
    assert unit is not None and unit.header == torch_include / "torch" / "extension.h"
    assert unit.flags == tuple(shlex.split(flags))  # the unit's own name and files are not the header's
    assert parse_unit(shlex.split(f"{flags} -c {other} -o other.o")) is None  # not its first include
    assert parse_unit(shlex.split(f"main.o -shared -o ext.so")) is None  # a link
    assert parse_unit(["--version"]) is None
    assert parse_unit(shlex.split(f"-DX -c {main} -o main.o")) is None  # no torch on its include path


def test_the_compiler_wrapper_is_written_whole_however_many_write_it_at_once(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from kbv.pch import compile_env

    with ThreadPoolExecutor(8) as pool:
        envs = list(pool.map(lambda _: compile_env(tmp_path), range(32)))
    script = Path(envs[0]["CXX"])
    assert all(env == envs[0] for env in envs) and os.access(script, os.X_OK)
    assert script.read_text().endswith('-m kbv.pch "$@"\n')
    assert sorted(p.name for p in (tmp_path / "pch").iterdir()) == ["kbv-cxx"]  # no file left half-made


def _disassembly(obj: Path) -> str:
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(obj)], capture_output=True, text=True,
                         check=True).stdout
    return out.split("\n", 3)[3]  # past the header that names the file


@pytest.mark.slow
def test_the_bindings_file_uses_the_shared_header_and_compiles_to_the_same_code(cache_dir: Path,
                                                                               tmp_path: Path) -> None:
    from kbv.pch import warm

    pair = _pair(CPP_RELU, "19_ReLU__cpp")
    assert warm(cache_dir, None) == []  # kbv makes the header for load_inline's default flags, trusted
    objects = {}
    for pch in (True, False):
        settings = Settings(device="cpu", run_dir=tmp_path / "run", cache_dir=cache_dir, jobs=1, pch=pch)
        build = build_candidate(pair.candidate, settings, f"pch-{pch}")
        assert build.status is None, build.message
        ext = build.build_dir / "torch_extensions" / "kbv_test_relu_cpp"
        objects[pch] = ext / "main.o"
        deps = subprocess.run(["ninja", "-t", "deps", "main.o"], cwd=ext, capture_output=True, text=True).stdout
        uses_header = str(cache_dir / "pch") in deps
        assert uses_header is pch, deps
    variants = [d for d in (cache_dir / "pch").iterdir() if (d / "ok").exists()]
    assert variants and (variants[0] / "torch" / "extension.h.gch").stat().st_size > 0
    assert _disassembly(objects[True]) == _disassembly(objects[False])


@pytest.mark.slow
def test_a_candidates_build_cannot_make_or_change_the_shared_headers(tmp_path: Path) -> None:
    """Only kbv makes precompiled headers: a build, which runs the candidate's code, sees their
    directory read-only, so it can neither plant a header nor swap the compiler script later builds
    run (it compiles without a header that is not there)."""
    from kbv.sandbox.isolation import SandboxMode, resolve

    if not resolve(SandboxMode.AUTO).full:
        pytest.skip("needs full isolation (bubblewrap)")
    planter = CPP_RELU.replace("import torch\n", "import torch, pathlib, os\n"
                               "for f in pathlib.Path(os.environ['KBV_PCH_DIR']).glob('*'):\n"
                               "    try:\n        f.write_text('planted')\n    except OSError:\n        pass\n", 1)
    cache = tmp_path / "cache"
    settings = Settings(device="cpu", run_dir=tmp_path / "run", cache_dir=cache, jobs=1, pch=True)
    script = (cache / "pch" / "kbv-cxx")
    build = build_candidate(_pair(planter, "19_ReLU__cpp").candidate, settings, "planter")
    assert build.status is None, build.message
    assert not [d for d in (cache / "pch").iterdir() if (d / "ok").exists()]
    assert script.read_text().endswith('-m kbv.pch "$@"\n')  # the compiler script is kbv's still
