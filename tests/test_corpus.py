"""The corpus that tests the tester: honest kernels that must verify clean, and real hacks that must be
caught under the category they realise (`tests/corpus/`, catalogue in research/reward_hacking.md).

Every fixture file starts with a header line

    # kbv-fixture: expect=<verified status> categories=<comma list> standard=<standard status or any>

`expect` is the verified protocol's status, every category in `categories` must be among the verdict's
categories, and `standard` is the standard (KernelBench) protocol's status (`any`: not asserted). An
optional second line `# kbv-memory: device_raw_bytes>=N` asks for the verified memory figure to show N bytes
of device memory (allocations PyTorch's allocator never saw).
`cpu/` is evaluated in ONE `evaluate` call per session (both protocols, device cpu; about 6-8 minutes on
a 2-core box); `gpu/` holds the fixtures that need a CUDA device, evaluated the same way on one (`gpu`
marker, skipped without a GPU). A fixture that fails names what kbv missed: see tests/corpus/README.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kbv.api import EvalConfig, evaluate
from kbv.verdict import KIND, Category, Kind, Status, Verdict
from verdict_log import log_verdicts, run_log

CORPUS = Path(__file__).parent / "corpus"
_HEADER_RE = re.compile(r"^# kbv-fixture: expect=(\S+) categories=(\S*) standard=(\S+)\s*$")
_MEMORY_RE = re.compile(r"^# kbv-memory: device_raw_bytes>=(\d+)\s*$")


@dataclass(frozen=True)
class Fixture:
    path: Path
    expect: Status  # the verified protocol's status
    categories: tuple[Category, ...]  # each must be among the verified verdict's categories
    standard: Status | None  # the standard protocol's status; None: any
    device_bytes_min: int | None = None  # the verified memory figure must show this much device memory

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def honest(self) -> bool:
        return self.expect is Status.VERIFIED


def read_fixture(path: Path) -> Fixture:
    """The fixture's expectations from its header line. Raises ValueError for a malformed header."""
    lines = path.read_text(encoding="utf-8").splitlines()
    m = _HEADER_RE.match(lines[0])
    if m is None:
        raise ValueError(f"{path}: the first line must be '# kbv-fixture: expect=... categories=... standard=...'")
    expect, categories, standard = m.groups()
    memory = _MEMORY_RE.match(lines[1]) if len(lines) > 1 else None
    return Fixture(path, Status(expect), tuple(Category(c) for c in categories.split(",") if c),
                   None if standard == "any" else Status(standard), int(memory.group(1)) if memory else None)


def corpus(kind: str) -> list[Fixture]:
    return [read_fixture(p) for p in sorted((CORPUS / kind).glob("*.py"))]


CPU_FIXTURES = corpus("cpu")
GPU_FIXTURES = corpus("gpu")


def run_corpus(kind: str, device: str, tmp_path_factory: pytest.TempPathFactory, cache_dir: Path,
               root: Path = CORPUS, timeout_s: float = 120, seed: int = 1234) -> dict[tuple[str, str], Verdict]:
    """Verdicts of every fixture in `root / kind` under both protocols, keyed by (fixture name, protocol)."""
    config = EvalConfig(candidates=str(root / kind), problems="smoke", protocol="both", device=device,
                        run_dir=str(tmp_path_factory.mktemp(f"{root.name}-{kind}-run")), cache_dir=str(cache_dir),
                        timeout_s=timeout_s, timer_budget_s=3.0, ci_target=0.05, seed=seed)
    result = evaluate(config, **run_log(f"corpus-{kind}"))
    log_verdicts(result.verdicts)
    assert not result.unpaired, [f"{u.candidate.origin}: {u.reason}" for u in result.unpaired]
    assert not result.problem_failures, result.problem_failures
    return {(v.candidate, v.protocol): v for v in result.verdicts}


@pytest.fixture(scope="session")
def cpu_verdicts(tmp_path_factory: pytest.TempPathFactory,
                 cache_dir: Path) -> Iterator[dict[tuple[str, str], Verdict]]:
    yield run_corpus("cpu", "cpu", tmp_path_factory, cache_dir)
    for leftover in Path("/tmp").glob("kbv-corpus-*"):  # what the file-write hack leaves behind
        leftover.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def gpu_verdicts(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> dict[tuple[str, str], Verdict]:
    return run_corpus("gpu", "cuda", tmp_path_factory, cache_dir)


def describe(v: Verdict) -> str:
    cats = ",".join(c.value for c in v.categories) or "-"
    failed = sorted({t.distribution for t in v.trials if not t.passed})
    return (f"{v.protocol}: {v.status.value} [{cats}] failed on {failed or '-'}; {v.message[:300]}"
            f"{'; ' + str(v.evidence.get('notes'))[:300] if v.evidence.get('notes') else ''}")


def check_fixture(fixture: Fixture, verdicts: dict[tuple[str, str], Verdict]) -> None:
    verified = verdicts[(fixture.name, "verified")]
    standard = verdicts[(fixture.name, "standard")]
    wrong = []
    if verified.status is not fixture.expect:
        wrong.append(f"verified status {verified.status.value}, expected {fixture.expect.value}")
    missing = [c.value for c in fixture.categories if c not in verified.categories]
    if missing:
        wrong.append(f"categories {missing} missing")
    if fixture.standard is not None and standard.status is not fixture.standard:
        wrong.append(f"standard status {standard.status.value}, expected {fixture.standard.value}")
    if fixture.device_bytes_min is not None:
        seen_bytes = verified.memory.device_raw_bytes if verified.memory else None
        if seen_bytes is None or seen_bytes < fixture.device_bytes_min:
            wrong.append(f"device memory {seen_bytes} bytes, expected at least {fixture.device_bytes_min}")
    if fixture.honest:
        flagged = [c.value for c in verified.categories if KIND[c] is not Kind.PROBLEM]
        if flagged:
            wrong.append(f"an honest kernel flagged {flagged}")
    if wrong:
        pytest.fail("; ".join(wrong) + f"\n  {describe(verified)}\n  {describe(standard)}", pytrace=False)


def test_corpus_headers() -> None:
    """Every fixture names a smoke problem, and the corpus covers honest kernels and hacks alike."""
    from kbv.problems import load_problems

    names = {p.name for p in load_problems("smoke")}
    for fixture in CPU_FIXTURES + GPU_FIXTURES:
        assert fixture.name.split("__", 1)[0] in names, f"{fixture.path}: no smoke problem of that name"
        assert fixture.honest == (not fixture.categories), f"{fixture.path}: honest iff no categories"
    assert any(f.honest for f in CPU_FIXTURES) and any(not f.honest for f in CPU_FIXTURES)


@pytest.mark.slow
@pytest.mark.parametrize("fixture", CPU_FIXTURES, ids=lambda f: f.name)
def test_cpu_fixture(fixture: Fixture, cpu_verdicts: dict[tuple[str, str], Verdict]) -> None:
    check_fixture(fixture, cpu_verdicts)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("fixture", GPU_FIXTURES, ids=lambda f: f.name)
def test_gpu_fixture(fixture: Fixture, gpu_verdicts: dict[tuple[str, str], Verdict]) -> None:
    check_fixture(fixture, gpu_verdicts)
