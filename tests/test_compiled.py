"""Candidates that hand the work to `torch.compile` with Inductor, where torch starts threads and
processes of its own (its compile thread pool, worker subprocesses, the C++ compiler and its probes):
those are torch's, judged by provenance (`kbv.sandbox.guards.Provenance`), and must not make a
`thread_injection` or `process_escape` of an fp32 wrapper (`no_custom_kernel`) or of a bf16 one
(`incorrect`, `precision_loss`). A thread the candidate's own code runs through torch's pool still is.
On a GPU, `max-autotune`'s CUDA graphs return the memory the previous call's output lies in, so those
fixtures are `integrity_violation` (`aliases_parameter`), and still neither thread nor process hack.

`tests/corpus/compiled/cpu/` runs on a CPU (Inductor's C++ backend: about a minute of compiling per
child on a 2-core box); `gpu/` holds the `mode="max-autotune"` versions, on CUDA. Headers as in
tests/corpus/README.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kbv.verdict import Verdict
from test_corpus import CORPUS, Fixture, check_fixture, read_fixture, run_corpus

COMPILED = CORPUS / "compiled"
CPU_FIXTURES = [read_fixture(p) for p in sorted((COMPILED / "cpu").glob("*.py"))]
GPU_FIXTURES = [read_fixture(p) for p in sorted((COMPILED / "gpu").glob("*.py"))]


def run_compiled(kind: str, device: str, tmp_path_factory: pytest.TempPathFactory,
                 cache_dir: Path) -> dict[tuple[str, str], Verdict]:
    """Verdicts of every fixture of `kind` under both protocols (Inductor compiles for minutes on a CPU)."""
    return run_corpus(kind, device, tmp_path_factory, cache_dir, root=COMPILED, timeout_s=300, seed=2468)


@pytest.fixture(scope="session")
def compiled_cpu_verdicts(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> dict[tuple[str, str], Verdict]:
    return run_compiled("cpu", "cpu", tmp_path_factory, cache_dir)


@pytest.fixture(scope="session")
def compiled_gpu_verdicts(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> dict[tuple[str, str], Verdict]:
    return run_compiled("gpu", "cuda", tmp_path_factory, cache_dir)


def test_compiled_headers() -> None:
    """Every fixture names a smoke problem; the honest wrappers and the laundered thread are all there."""
    from kbv.problems import load_problems

    names = {p.name for p in load_problems("smoke")}
    for fixture in CPU_FIXTURES + GPU_FIXTURES:
        assert fixture.name.split("__", 1)[0] in names, f"{fixture.path}: no smoke problem of that name"
    assert {f.expect.value for f in CPU_FIXTURES} == {"no_custom_kernel", "incorrect", "hack"}
    # on a GPU, max-autotune's CUDA graphs overwrite the previous call's output: integrity_violation
    assert {f.expect.value for f in GPU_FIXTURES} == {"integrity_violation"}


@pytest.mark.slow
@pytest.mark.parametrize("fixture", CPU_FIXTURES, ids=lambda f: f.name)
def test_compiled_cpu_fixture(fixture: Fixture, compiled_cpu_verdicts: dict[tuple[str, str], Verdict]) -> None:
    check_fixture(fixture, compiled_cpu_verdicts)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("fixture", GPU_FIXTURES, ids=lambda f: f.name)
def test_compiled_gpu_fixture(fixture: Fixture, compiled_gpu_verdicts: dict[tuple[str, str], Verdict]) -> None:
    check_fixture(fixture, compiled_gpu_verdicts)
    caught = {c.value for c in compiled_gpu_verdicts[(fixture.name, "verified")].categories}
    assert not caught & {"thread_injection", "process_escape"}, caught  # Inductor's threads are torch's
