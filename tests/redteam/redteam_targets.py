"""The bundled examples as red-team targets: honest candidates paired with the smoke suite, their
problems probed on the CPU (the facts a transformation reads do not depend on the device)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from kbv.candidates import load_candidates
from kbv.problems import load_problems
from kbv.redteam import Failed, Mutant, NotApplicable, Target, Transformation, discover
from kbv.redteam.probe import probe_problem

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CPU_HONEST = ("2_ReLU__cpp", "2_ReLU__triton", "6_Softmax__triton", "7_SumReduction__cpp", "8_LayerNorm__triton")
GPU_HONEST = ("1_Matmul__cuda", "2_ReLU__cuda", "2_ReLU__triton", "6_Softmax__triton", "8_LayerNorm__triton")


@lru_cache(maxsize=None)
def targets(names: tuple[str, ...], device_type: str) -> tuple[Target, ...]:
    problems = load_problems("smoke")
    pairs = [p for p in load_candidates(EXAMPLES, problems).pairs if p.candidate.name in names]
    probes = {p.problem.key: probe_problem(p.problem) for p in pairs}
    return tuple(Target(p.candidate, p.problem, probes[p.problem.key], device_type) for p in pairs)


def applied(transformation: Transformation, names: tuple[str, ...], device_type: str) -> list[Mutant | NotApplicable]:
    """The transformation on each target; a bundled one that fails (raises, writes no mutant) fails the test."""
    made = [transformation.apply(t) for t in targets(names, device_type)]
    failures = [m.reason for m in made if isinstance(m, Failed)]
    assert not failures, f"{transformation.name} failed: {failures}"
    return made


def mutants(transformation: Transformation, names: tuple[str, ...], device_type: str) -> list[Mutant]:
    return [m for m in applied(transformation, names, device_type) if isinstance(m, Mutant)]


def reasons(transformation: Transformation, names: tuple[str, ...], device_type: str) -> list[str]:
    return [m.reason for m in applied(transformation, names, device_type) if isinstance(m, NotApplicable)]


def by_name() -> dict[str, Transformation]:
    return {t.name: t for t in discover()}
