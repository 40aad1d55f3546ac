"""The build stage (`kbv.builds`, `kbv.pch`): a build runs where and how the pool says (build cores,
lowest priority, ninja's share of the CPUs, the compiler wrapper) and its CPU-seconds are measured;
the bindings file of a C++ extension uses the shared precompiled torch header, and its object code
is the one it has without; which compiles can use the header at all. What a candidate builds at
import (`load` of sources it writes, a `load_inline` that fails inside its own try) is built or failed
once, in the build phase: its evaluation children, under both protocols, never run the compiler."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from kbv.builds import BuildPool, as_users_file, build_candidate, clear_stale_batons
from kbv.candidates import Candidate, Pair
from kbv.pch import installation_key, parse_unit
from kbv.placement import BUILD_NICE, CorePlan, Isolation
from kbv.problems import Problem
from kbv.settings import Settings
from kbv.verdict import Status, Verdict
from sources import CPP_BROKEN_IN_INIT, CPP_BROKEN_WITH_FALLBACK, CPP_RELU, CPP_RELU_FROM_FILES

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
    assert probe["cxx"] == str(tmp_path / "cache" / "pch" / "installs" / installation_key() / "kbv-cxx")
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
    assert sorted(p.name for p in script.parent.iterdir()) == ["kbv-cxx"]  # no file left half-made


def test_another_installation_sharing_the_cache_never_changes_this_ones_compiler(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two installations of kbv share one cache: the other (an interpreter this one's builds cannot
    run, as in another's venv outside the sandbox) writes its compiler script after this one did,
    and a compile through this one's script still works; each script names its own interpreter."""
    from kbv.pch import compile_env

    ours = compile_env(tmp_path)
    other_python = str(tmp_path / "other-venv" / "bin" / "python")
    with monkeypatch.context() as m:
        m.setattr(sys, "executable", other_python)
        theirs = compile_env(tmp_path)
    source = tmp_path / "one.cpp"
    source.write_text("int one() { return 1; }\n")
    done = subprocess.run([ours["CXX"], "-c", str(source), "-o", str(tmp_path / "one.o")],
                          env={**os.environ, **ours}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "one.o").stat().st_size > 0
    assert ours["CXX"] != theirs["CXX"] and ours["KBV_PCH_DIR"] == theirs["KBV_PCH_DIR"]  # headers shared
    assert f"exec {shlex.quote(sys.executable)} -m kbv.pch" in Path(ours["CXX"]).read_text()
    assert f"exec {shlex.quote(other_python)} -m kbv.pch" in Path(theirs["CXX"]).read_text()


def test_the_compiler_script_names_the_interpreter_a_sandboxed_build_can_see(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A virtual environment reached through a link (`.venv -> /elsewhere/venv`): a build in bubblewrap
    sees it under its real path only, so the script must not name the link's."""
    from kbv.pch import compile_env

    python = Path(sys.executable)
    link = tmp_path / "venv-link"
    link.symlink_to(python.parent.parent)
    monkeypatch.setattr(sys, "executable", str(link / python.parent.name / python.name))
    text = Path(compile_env(tmp_path / "cache")["CXX"]).read_text()
    real = Path(os.path.realpath(python.parent)) / python.name
    assert f"exec {shlex.quote(str(real))} -m kbv.pch" in text and str(link) not in text


def test_another_installation_builds_a_candidate_in_a_directory_of_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A build's ninja file names its installation's torch and compiler script: another installation
    sharing the cache builds the same candidate apart, never over this one's build."""
    from kbv.builds import prepare_candidate

    settings = Settings(device="cpu", run_dir=tmp_path / "run", cache_dir=tmp_path / "cache", jobs=1)
    candidate = _pair(CPP_RELU, "19_ReLU__cpp").candidate
    ours = prepare_candidate(candidate, settings).build_dir
    with monkeypatch.context() as m:
        m.setattr(sys, "executable", str(tmp_path / "other-venv" / "bin" / "python"))
        theirs = prepare_candidate(candidate, settings).build_dir
    assert ours != theirs and prepare_candidate(candidate, settings).build_dir == ours


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
                               "for f in pathlib.Path(os.environ['KBV_PCH_DIR']).rglob('*'):\n"
                               "    try:\n        f.write_text('planted')\n    except OSError:\n        pass\n", 1)
    cache = tmp_path / "cache"
    settings = Settings(device="cpu", run_dir=tmp_path / "run", cache_dir=cache, jobs=1, pch=True)
    script = Path(settings.compile_env()["CXX"])
    build = build_candidate(_pair(planter, "19_ReLU__cpp").candidate, settings, "planter")
    assert build.status is None, build.message
    assert not [d for d in (cache / "pch").iterdir() if (d / "ok").exists()]
    assert script.read_text().endswith('-m kbv.pch "$@"\n')  # the compiler script is kbv's still


# -- what a candidate builds at import: built (or failed) once, in the build phase ----------------

# The C++ compiler of the builds below: it writes down where each run of it comes from (the child's
# HOME is its working directory: `build-...` for the build child, the protocol's name for the others)
LOGGED_CXX = '#!/bin/sh\necho "$HOME $*" >> "$TORCH_EXTENSIONS_DIR/kbv-test-compiles.log"\nexec c++ "$@"\n'


@pytest.fixture(scope="module")
def import_builds(tmp_path_factory: pytest.TempPathFactory, relu_problems: Path,
                  cache_dir: Path) -> tuple[dict[tuple[str, str], Verdict], dict[str, list[str]]]:
    """Both protocols' verdicts of a candidate that writes its sources to a temporary directory and
    `load`s them, and of one whose `load_inline` fails inside its own try (PyTorch instead); and, for
    each, the compiles its evaluation children ran (HOME and the compiler's arguments)."""
    from kbv.api import EvalConfig, evaluate
    from sources import write_tree

    root = tmp_path_factory.mktemp("import-builds")
    cxx = root / "toolchain" / "bin" / "logged-c++"
    cxx.parent.mkdir(parents=True)
    cxx.write_text(LOGGED_CXX)
    cxx.chmod(0o755)
    codes = {"from_files": CPP_RELU_FROM_FILES, "fallback": CPP_BROKEN_WITH_FALLBACK,
             "in_init": CPP_BROKEN_IN_INIT}
    cands = write_tree(root / "candidates", {f"19_ReLU__{k}.py": code for k, code in codes.items()})
    logs = {k: _compile_log(cache_dir, code) for k, code in codes.items()}
    seen = {k: log.read_text().splitlines() if log.exists() else [] for k, log in logs.items()}
    saved = os.environ.get("CXX")
    os.environ["CXX"] = str(cxx)
    try:
        result = evaluate(EvalConfig(candidates=str(cands), problems=str(relu_problems), device="cpu",
                                     protocol="both", run_dir=str(root / "run"), cache_dir=str(cache_dir),
                                     timeout_s=300, jobs=2))
    finally:
        if saved is None:
            os.environ.pop("CXX", None)
        else:
            os.environ["CXX"] = saved
    verdicts = {(v.candidate.removeprefix("19_ReLU__"), v.protocol): v for v in result.verdicts}
    compiles = {}
    for k, log in logs.items():
        assert log.exists(), f"no compile was logged where the test looks ({log}): the build ran elsewhere"
        lines = log.read_text().splitlines()[len(seen[k]):]
        compiles[k] = [line for line in lines if " -c " in line and not Path(line.split()[0]).name.startswith("build-")]
    return verdicts, compiles


def _compile_log(cache_dir: Path, code: str) -> Path:
    from kbv.builds import prepare_candidate
    from kbv.settings import cuda_arch_list

    candidate = Candidate(code=code, name="19_ReLU__x", origin="x.py", problem_ref="19_ReLU")
    settings = Settings(device="cpu", run_dir=cache_dir / "unused", cache_dir=cache_dir,
                        cuda_arch_list=cuda_arch_list("cpu"))
    return prepare_candidate(candidate, settings).build_dir / "torch_extensions" / "kbv-test-compiles.log"


@pytest.mark.slow
def test_sources_a_candidate_writes_and_loads_at_import_are_compiled_once_never_on_a_lane(
        import_builds: tuple[dict[tuple[str, str], Verdict], dict[str, list[str]]]) -> None:
    """Every child rewrites the sources (a new temporary directory, new mtimes): the evaluation
    children of both protocols import the module the build phase built, without a compiler."""
    verdicts, compiles = import_builds
    assert compiles["from_files"] == []
    assert verdicts[("from_files", "standard")].status is Status.CORRECT, verdicts[("from_files", "standard")].message
    verified = verdicts[("from_files", "verified")]
    assert verified.status is Status.VERIFIED, verified.message
    assert all("load" in verdicts[("from_files", p)].evidence["stages_s"] for p in ("standard", "verified"))


@pytest.mark.slow
def test_a_build_that_failed_inside_the_candidates_own_try_is_replayed_not_compiled_again(
        import_builds: tuple[dict[tuple[str, str], Verdict], dict[str, list[str]]]) -> None:
    """The build phase's failure is raised again at once in each evaluation child (the same type and
    message: the candidate's own check of it passes), so the candidate takes its PyTorch fallback."""
    verdicts, compiles = import_builds
    assert compiles["fallback"] == []
    assert verdicts[("fallback", "standard")].status is Status.CORRECT, verdicts[("fallback", "standard")].message
    assert verdicts[("fallback", "verified")].status is Status.NO_CUSTOM_KERNEL, verdicts[("fallback", "verified")].message


@pytest.mark.slow
def test_a_build_the_constructor_makes_is_made_in_the_build_phase_not_on_a_lane(
        import_builds: tuple[dict[tuple[str, str], Verdict], dict[str, list[str]]]) -> None:
    """`load_inline` in `ModelNew.__init__`: the build phase constructs the candidate with the problem's
    init inputs, so its evaluation children replay the recorded failure and compile nothing."""
    verdicts, compiles = import_builds
    assert compiles["in_init"] == []
    assert verdicts[("in_init", "standard")].status is Status.CORRECT, verdicts[("in_init", "standard")].message
    assert verdicts[("in_init", "verified")].status is Status.NO_CUSTOM_KERNEL, verdicts[("in_init", "verified")].message


def test_messages_about_a_candidate_name_the_users_file_not_its_build_copy() -> None:
    """Candidates with one source share a build: each pair's verdict names its own file instead."""
    trace = ('  File "/home/u/.cache/kbv/builds/0a1b2c/candidate.py", line 2, in <module>\n'
             "SyntaxError: expected ':' (candidate.py, line 2)\ncandidate.py defines no ModelNew")
    assert as_users_file(trace, "examples/x.py") == (
        '  File "examples/x.py", line 2, in <module>\n'
        "SyntaxError: expected ':' (examples/x.py, line 2)\nexamples/x.py defines no ModelNew")
    untouched = "my_candidate.py, candidate.pyc, /a/b/old-candidate.py"
    assert as_users_file(untouched, "examples/x.py") == untouched


def test_a_build_killed_midway_leaves_no_lock_that_stalls_the_next(tmp_path: Path) -> None:
    """torch's builder holds `torch_extensions/<name>/lock` while it compiles; killed (an interrupted
    run), it leaves the file, and the next build of that candidate waited for it until its timeout."""
    left = tmp_path / "torch_extensions" / "kbv_example_relu_cpp" / "lock"
    left.parent.mkdir(parents=True)
    left.write_text("")
    kept = tmp_path / "torch_extensions" / "kbv_example_relu_cpp" / "main.cpp"
    kept.write_text("// the sources stay")
    assert clear_stale_batons(tmp_path) == [left]
    assert not left.exists() and kept.exists() and clear_stale_batons(tmp_path) == []
