"""The standard (KernelBench) protocol's decisions on honest and wrong candidates, through evaluate().

One run over a directory at the default tolerance (1e-2), a second over two of the same candidates
in the same run directory at KernelBench HEAD's 1e-4, and a third with KernelBench's `host_time`
timer. The `unstable_timing` rule on its own, as the pure function it is.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from kbv.api import EvalConfig, RunResult, evaluate
from kbv.protocols.standard import BASELINE_ATTEMPTS, _timing, baseline_disagreement, time_bracketed, unstable_timing
from kbv.settings import Settings
from kbv.verdict import KIND, Category, Kind, Status, TimingStats, Verdict
from sources import (DTYPE_RELU, HONEST_LINEAR, HONEST_RELU, LINEAR_PROBLEM, NEAR_RELU, NONE_RELU, RELU_PROBLEM,
                     SHAPE_RELU, TUPLE_RELU, WRONG_RELU, write_tree)

CANDIDATES = {
    "19_ReLU__honest.py": HONEST_RELU,
    "19_ReLU__honest_again.py": HONEST_RELU,  # a second sample with the same code
    "19_ReLU__wrong.py": WRONG_RELU,
    "19_ReLU__shape.py": SHAPE_RELU,
    "19_ReLU__dtype.py": DTYPE_RELU,
    "19_ReLU__tuple.py": TUPLE_RELU,
    "19_ReLU__none.py": NONE_RELU,
    "19_ReLU__near.py": NEAR_RELU,
    "3_Linear__honest.py": HONEST_LINEAR,
    # an honest ReLU whose every other call sleeps 2 ms: its trials spread widely, whatever the machine
    "19_ReLU__jittery.py": ("import time\nimport torch\n\n\nclass ModelNew(torch.nn.Module):\n"
                            "    calls = 0\n\n    def forward(self, x):\n        ModelNew.calls += 1\n"
                            "        if ModelNew.calls % 2:\n            time.sleep(0.002)\n"
                            "        return torch.relu(x)\n"),
}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("standard")
    write_tree(root / "problems", {"level1/19_ReLU.py": RELU_PROBLEM, "level1/3_Linear.py": LINEAR_PROBLEM})
    write_tree(root / "candidates", CANDIDATES)
    write_tree(root / "strict", {k: CANDIDATES[k] for k in ("19_ReLU__honest.py", "19_ReLU__near.py")})
    return root


def _config(root: Path, candidates: str, cache_dir: Path, **kw: object) -> EvalConfig:
    return EvalConfig(candidates=str(root / candidates), problems=str(root / "problems"), device="cpu",
                      run_dir=str(root / "run"), cache_dir=str(cache_dir), timeout_s=120,
                      **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def loose(workspace: Path, cache_dir: Path) -> RunResult:
    return evaluate(_config(workspace, "candidates", cache_dir))


@pytest.fixture(scope="module")
def strict(workspace: Path, cache_dir: Path, loose: RunResult) -> RunResult:
    return evaluate(_config(workspace, "strict", cache_dir, tolerance=1e-4))


@pytest.fixture(scope="module")
def host_timed(workspace: Path, cache_dir: Path, strict: RunResult) -> RunResult:
    write_tree(workspace / "host", {"19_ReLU__honest.py": HONEST_RELU})
    return evaluate(_config(workspace, "host", cache_dir, standard_timing="host_time"))


def _by_name(result: RunResult) -> dict[str, Verdict]:
    return {v.candidate: v for v in result.verdicts}


@pytest.fixture(scope="module")
def verdicts(loose: RunResult) -> dict[str, Verdict]:
    return _by_name(loose)


def test_honest_candidate_is_correct_with_a_speedup(verdicts: dict[str, Verdict]) -> None:
    v = verdicts["19_ReLU__honest"]
    assert v.status is Status.CORRECT and v.message == "5/5 trials passed"
    assert [t.passed for t in v.trials] == [True] * 5 and {t.max_abs_err for t in v.trials} == {0.0}
    assert v.timing is not None and v.timing.method == "host-timer"
    assert v.timing.candidate.n == 100  # KernelBench's 100 trials
    assert v.timing.baselines["eager"].n == 200  # the same timer, right before and right after the candidate
    *_, (before, after) = v.evidence["baseline_bracket_ms"]  # the last attempt's (a busy box may take two)
    assert v.timing.baselines["eager"].mean_ms == pytest.approx((before + after) / 2, rel=1e-4)
    assert v.speedup is not None and math.isfinite(v.speedup) and v.speedup > 0
    expected = v.timing.baselines["eager"].mean_ms / v.timing.candidate.mean_ms
    assert v.speedup == pytest.approx(expected)  # baseline / candidate, on the mean


def test_two_samples_with_the_same_code_are_each_evaluated(verdicts: dict[str, Verdict]) -> None:
    """Their children share a label (the code's hash), never a working directory."""
    for name in ("19_ReLU__honest", "19_ReLU__honest_again"):
        assert verdicts[name].status is Status.CORRECT, verdicts[name].message


def test_same_layers_under_the_same_seed_get_the_same_weights(verdicts: dict[str, Verdict]) -> None:
    v = verdicts["3_Linear__honest"]
    assert v.status is Status.CORRECT, v.message
    assert v.problem == "L1/3_Linear"


def test_wrong_values_are_incorrect_with_trial_evidence(verdicts: dict[str, Verdict]) -> None:
    v = verdicts["19_ReLU__wrong"]
    assert v.status is Status.INCORRECT and v.categories == (Category.VALUE_MISMATCH,)
    assert v.message.startswith("0/5 trials passed: max abs error")
    assert len(v.trials) == 5 and not any(t.passed for t in v.trials)
    assert all(t.max_abs_err is not None and t.max_abs_err > 1.0 for t in v.trials)  # |x| vs relu(x) on randn
    assert all(t.category is Category.VALUE_MISMATCH for t in v.trials)
    assert v.speedup is None and v.timing is None  # a wrong kernel is never timed


@pytest.mark.parametrize(("name", "category", "note"), [
    ("19_ReLU__shape", Category.SHAPE_MISMATCH, "shape (16, 255) != (16, 256)"),
    ("19_ReLU__dtype", Category.DTYPE_MISMATCH, "dtype float64 != float32"),
    ("19_ReLU__tuple", Category.SHAPE_MISMATCH, "returned 2 outputs, expected 1"),
    ("19_ReLU__none", Category.NOT_A_TENSOR, "returned a NoneType, not a tensor"),
])
def test_malformed_outputs_are_incorrect_with_the_reason(verdicts: dict[str, Verdict], name: str,
                                                         category: Category, note: str) -> None:
    v = verdicts[name]
    assert v.status is Status.INCORRECT
    assert v.categories == (category,)
    assert [t.note for t in v.trials] == [note] * 5
    assert note in v.message


def test_an_error_of_1e3_passes_at_tolerance_1e2(verdicts: dict[str, Verdict]) -> None:
    v = verdicts["19_ReLU__near"]
    assert v.status is Status.CORRECT, v.message
    assert all(5e-4 < t.max_abs_err < 2e-3 for t in v.trials)


def test_an_error_of_1e3_fails_at_tolerance_1e4(strict: RunResult) -> None:
    v = _by_name(strict)["19_ReLU__near"]
    assert v.status is Status.INCORRECT and v.categories == (Category.VALUE_MISMATCH,)
    assert v.protocol_version == "kernelbench-v0.1+tol0.0001"
    assert _by_name(strict)["19_ReLU__honest"].status is Status.CORRECT  # exact output passes either way


def test_other_rules_are_evaluated_anew_not_resumed(loose: RunResult, strict: RunResult) -> None:
    assert loose.evaluated == len(CANDIDATES)
    assert (strict.evaluated, strict.resumed) == (2, 0)  # same run dir, same pairs, other tolerance


def test_the_timing_method_is_recorded_in_every_standard_verdict(verdicts: dict[str, Verdict],
                                                                   host_timed: RunResult) -> None:
    assert {v.provenance["standard_timing"] for v in verdicts.values()} == {"cuda_event"}  # wrong ones too
    assert verdicts["19_ReLU__honest"].protocol_version == "kernelbench-v0.1+tol0.01"  # the default unchanged
    [v] = host_timed.verdicts
    assert v.status is Status.CORRECT and v.provenance["standard_timing"] == "host_time"
    assert v.timing is not None and v.timing.method == "host-timer (host_time)" and v.timing.candidate.n == 100
    assert v.protocol_version == "kernelbench-v0.1+tol0.01+host_time"
    assert (host_timed.evaluated, host_timed.resumed) == (1, 0)  # another timer: not resumed


def test_a_marked_correct_pair_keeps_its_status_and_speedup(verdicts: dict[str, Verdict]) -> None:
    v = verdicts["19_ReLU__jittery"]
    assert v.status is Status.CORRECT and v.message == "5/5 trials passed"
    assert Category.UNSTABLE_TIMING in v.categories and KIND[Category.UNSTABLE_TIMING] is Kind.TIMING
    assert v.timing is not None and v.speedup == pytest.approx(
        v.timing.baselines["eager"].mean_ms / v.timing.candidate.mean_ms)
    [note] = [n for n in v.timing.notes if n.startswith("unstable_timing: ")]
    assert "the candidate's trials spread" in note
    assert v.timing.candidate.host_ms is not None and v.timing.candidate.host_ms > 0


# -- the unstable_timing rule ------------------------------------------------------------------

def _stats(mean_ms: float, std_ms: float, host_ms: float | None = None) -> TimingStats:
    return TimingStats(mean_ms, mean_ms, std_ms, mean_ms - std_ms, mean_ms + 3 * std_ms, 100, host_ms=host_ms)


def test_tight_trials_with_a_host_path_well_under_the_flush_are_not_marked() -> None:
    tight = _stats(0.020, 0.0005, host_ms=0.010)
    assert unstable_timing(tight, _stats(0.030, 0.001, host_ms=0.012), flush_ms=0.070) == []
    assert unstable_timing(_stats(8.0, 0.05), _stats(9.0, 0.05), flush_ms=None) == []  # a CPU: no flush


def test_trials_that_spread_widely_are_marked_on_either_side() -> None:
    tight, spread = _stats(0.020, 0.0005), _stats(0.020, 0.006)  # std/mean 30%
    [why] = unstable_timing(spread, tight, flush_ms=None)
    assert why.startswith("the candidate's trials spread 30% of their mean")
    [why] = unstable_timing(tight, spread, flush_ms=None)
    assert why.startswith("the baseline's trials spread 30%")


def test_a_host_time_comparable_to_the_flush_is_a_race() -> None:
    tight = _stats(0.030, 0.001, host_ms=0.010)
    for host in (0.035, 0.070, 0.200):  # half the flush, the flush, three flushes
        [why] = unstable_timing(_stats(0.025, 0.0005, host_ms=host), tight, flush_ms=0.070)
        assert why.startswith("the candidate's forward spends") and "race" in why
    # far past the flush (host-bound), or under a device-bound forward's time: not a race
    assert unstable_timing(_stats(0.9, 0.01, host_ms=0.9), tight, flush_ms=0.070) == []
    assert unstable_timing(_stats(8.0, 0.05, host_ms=0.070), tight, flush_ms=0.070) == []


# -- the baseline timed beside every candidate --------------------------------------------------
# An H100, `launch` case, run 1 of bench/repeat.py: L1/2_ReLU's baseline, timed once when the problem
# was prepared, came out 0.0947 ms (a mean of 100 trials, KernelBench's timer) against 0.0042 ms in
# every other run, and its candidates 21x (an identity among them: 22.6x).

def _reply(mean_ms: float, spread_ms: float = 0.0002) -> dict:
    samples = [mean_ms + spread_ms * ((k % 5) - 2) / 2 for k in range(100)]
    return {"samples_ms": samples, "host_ms": [0.015] * 100, "flush_ms": 0.093}


class _Timings:
    """Replies handed out in turn, one side's timer each: what the windows of a pair measured."""

    def __init__(self, *means: float) -> None:
        self.means, self.calls = list(means), []

    def __call__(self) -> dict:
        self.calls.append(self.means[0])
        return _reply(self.means.pop(0))


def test_a_baseline_that_agrees_with_itself_across_the_candidate_is_timed_once_each_side() -> None:
    base, cand = _Timings(0.0042, 0.0043), _Timings(0.0044)
    timed = time_bracketed(lambda: (cand(), None), base)
    assert (len(base.calls), len(cand.calls)) == (2, 1) and timed.disagreement() is None
    assert timed.baseline().n == 200 and timed.baseline().mean_ms == pytest.approx(0.00425, rel=1e-3)
    assert timed.baseline().host_ms == pytest.approx(0.015)


def test_a_baseline_that_moved_under_the_candidate_is_timed_again_with_it() -> None:
    # the first timing met whatever slowed the H100's one run 20x; the second attempt is clean
    base, cand = _Timings(0.0947, 0.0042, 0.0042, 0.0043), _Timings(0.0045, 0.0044)
    timed = time_bracketed(lambda: (cand(), None), base)
    assert (len(base.calls), len(cand.calls)) == (4, 2)
    assert timed.disagreement() is None and timed.baseline().mean_ms == pytest.approx(0.00425, rel=1e-3)
    assert timed.bracket_means() == [(pytest.approx(0.0947), pytest.approx(0.0042)),
                                     (pytest.approx(0.0042), pytest.approx(0.0043))]


def test_a_baseline_that_never_agrees_with_itself_marks_the_verdict() -> None:
    base, cand = _Timings(*[0.0947, 0.0042] * BASELINE_ATTEMPTS), _Timings(*[0.0044] * BASELINE_ATTEMPTS)
    timed = time_bracketed(lambda: (cand(), None), base)
    assert len(cand.calls) == BASELINE_ATTEMPTS  # no more than that: the last attempt stands
    why = timed.disagreement()
    assert why is not None and "disagrees with itself: 0.0947 ms and 0.0042 ms" in why
    settings = Settings(device="cpu", run_dir=Path("/nonexistent-run"), cache_dir=Path("/nonexistent-cache"))
    timing, reasons = _timing(timed, None, "cuda_event", settings)
    assert any(r.startswith(why) and f"in each of {BASELINE_ATTEMPTS} attempts" in r for r in reasons)
    assert timing.notes[0].startswith("unstable_timing: ") and "disagrees with itself" in timing.notes[0]


def test_the_baselines_two_timings_agree_within_a_tenth() -> None:
    stats = lambda mean: TimingStats(mean, mean, 0.0, mean, mean, 100)  # noqa: E731
    assert baseline_disagreement(stats(2.65), stats(2.70)) is None  # a matmul's baseline, 2% apart
    assert baseline_disagreement(stats(0.0042), stats(0.0047)) is not None  # 12% apart
    assert baseline_disagreement(stats(0.0), stats(0.0)) is not None  # nothing measured is no figure


def test_a_trial_lets_the_last_ones_tensors_go_before_it_is_made() -> None:
    """Standard's trials, remade one at a time for a problem too large to hold them: the last trial's
    reference and output are gone when the next is made. KernelBench's L1/9 (4 GiB of output) held three
    outputs at once, 20 GB of a 24 GiB host."""
    import weakref

    import torch

    from kbv.protocols.standard import StandardProtocol, _run_trials

    alive: list[weakref.ref] = []

    class Context:
        trials = [None] * 3

        def trial(self, index: int):
            assert all(r() is None for r in alive), f"trial {index} made while the last one's tensors lived"
            inputs, references = [torch.rand(8)], [torch.rand(8)]
            alive.extend(weakref.ref(t) for t in (*inputs, *references))
            return inputs, references

    class Child:
        def put(self, values, timeout_s):
            return list(range(len(values)))

        def expect(self, like):
            return {}, None

        def call(self, command, timeout_s):
            self.out = torch.rand(8)
            alive.append(weakref.ref(self.out))
            return {"count": 1, "outputs": [{"tensor": True, "shape": [8], "dtype": "float32", "device": "cpu"}]}

        def take(self, reply, receipt, timeout_s):
            out, self.out = self.out, None
            return [out]

    trials = _run_trials(Child(), Context(), StandardProtocol(), time.monotonic() + 60, torch.device("cpu"))
    assert len(trials) == 3
