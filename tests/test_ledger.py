"""What preparing a problem for the verified protocol costs, in reference calls (kbv.ledger): counted
by purpose, distribution and precision; shared between the truth, the calibration and the screen;
none for a candidate while the plan holds the trials' truth; bounded, naming the step."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from kbv.footprint import problem_footprint
from kbv.gate import DeviceGate, holding, waited_s
from kbv.inputs import rng_isolated
from kbv.ledger import CallLedger, PreparationTimeout, bounded
from kbv.memory_plan import Hold, Need, VerifiedPlan
from kbv.precision import precision_policy
from kbv.problems import load_problem_file
from kbv.protocols.verified.prepare import prepare_trials
from kbv.protocols.verified.rules import VerifiedProtocol
from lanes import run_lanes
from sources import write_tree

INPUTS = "\ndef get_inputs():\n    return [torch.rand(16, 64)]\ndef get_init_inputs():\n    return []\n"
GELU = ("import math, torch, torch.nn as nn\nclass Model(nn.Module):\n    def forward(self, x):\n"
        "        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))\n" + INPUTS)
# log of negative inputs is NaN: `signed` steps to its positive variant, one refused call of calibration's own
LOG = "import torch, torch.nn as nn\nclass Model(nn.Module):\n    def forward(self, x):\n        return torch.log(x)\n" + INPUTS
MATMUL = ("import torch, torch.nn as nn\nclass Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
          "        self.fc = nn.Linear(64, 32)\n    def forward(self, x):\n        return self.fc(x)\n" + INPUTS)


def _prepare(tmp_path: Path, source: str, hold: Hold = Hold.ALL, ledger: CallLedger | None = None,
             device: str = "cpu"):
    path = write_tree(tmp_path, {"level1/1_P.py": source}) / "level1" / "1_P.py"
    problem = load_problem_file(path)
    fp = problem_footprint(problem)
    plan = VerifiedPlan(hold, 10 if hold is not Hold.NONE else 0, "device", 1 << 30, Need(0, 0))
    return prepare_trials(problem, VerifiedProtocol(), torch.device(device), b"\x07" * 16, plan=plan, footprint=fp,
                          ledger=ledger)


def test_an_elementwise_problem_costs_two_calls_a_trial_and_two_a_distribution_for_the_screen(tmp_path):
    prepared = _prepare(tmp_path, GELU)
    s = prepared.ledger.summary()
    # 5 distributions x 2 trials: a baseline and a float64 truth each; the screen runs the reference once
    # more on the same inputs (determinism) and once at the next trial's inputs, and on the first
    # distribution the same model once again (state kept across calls); calibration's accepted call
    # is each first trial's own baseline call; no TF32 call: the forward runs no operator TF32 changes
    assert s["by_purpose"] == {"baseline": 10, "truth": 10, "screen": 11}
    assert s["by_precision"] == {"float64": 10, "tf32": 21}
    assert s["by_distribution"] == {"default": 7, **{d: 6 for d in ("signed", "large", "small", "range")}}
    assert prepared.screen is not None and prepared.screen.flags == ()


def test_a_refused_variant_is_calibrations_own_call_and_the_accepted_one_is_the_trials(tmp_path):
    s = _prepare(tmp_path, LOG).ledger.summary()
    assert s["by_purpose"]["calibration"] >= 1  # `signed` drew negatives first: NaN, refused
    assert s["by_purpose"]["baseline"] == s["by_purpose"]["truth"]


def test_a_matmul_on_a_cpu_still_asks_whether_tf32_matters(tmp_path):
    s = _prepare(tmp_path, MATMUL).ledger.summary()
    assert s["by_purpose"]["tf32"] >= 10  # the strict-fp32 call of every trial
    assert s["by_precision"]["fp32"] >= 10


BATCHNORM = ("import torch, torch.nn as nn\nclass Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
             "        self.bn = nn.BatchNorm1d(64)\n    def forward(self, x):\n        return self.bn(x)\n" + INPUTS)


@pytest.mark.parametrize("cuda_like", [False, True])
def test_every_trial_knows_what_the_reference_changes_in_batchnorms_running_statistics(tmp_path, monkeypatch,
                                                                                        cuda_like):
    """A first trial's baseline call is calibration's; where nothing after it calls the model at its
    own precision (on CUDA a convolution asks no strict-fp32 call), the trial must still record the
    running statistics the reference's call moves, or an honest candidate is parameter_mutated (three
    shaped BatchNorm fixtures on an H100)."""
    from kbv.reference import Reference

    if cuda_like:
        monkeypatch.setattr(Reference, "_may_use_tf32", lambda self: False)
    prepared = _prepare(tmp_path, BATCHNORM)
    for t in prepared.trials:
        assert set(t.evaluation.changes or {}) == {"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"}, \
            t.label


@pytest.mark.parametrize("hold, calls", [(Hold.ALL, 0), (Hold.TRUTH, 0), (Hold.NONE, 20)])
def test_a_candidate_costs_no_reference_call_while_the_truth_is_held(tmp_path, hold, calls):
    prepared = _prepare(tmp_path, GELU, hold)
    made = prepared.ledger.total
    for t in prepared.trials:  # what a candidate's correctness reads
        assert t.inputs and t.evaluation.truth
        t.state  # noqa: B018
        t.release()
    assert prepared.ledger.total - made == calls


def test_remade_inputs_and_weights_are_the_ones_the_truth_was_made_from(tmp_path):
    kept = _prepare(tmp_path / "a", MATMUL, Hold.ALL)
    remade = _prepare(tmp_path / "b", MATMUL, Hold.TRUTH)
    for a, b in zip(kept.trials, remade.trials):
        assert torch.equal(a.inputs[0], b.inputs[0])
        assert all(torch.equal(a.state[k], b.state[k]) for k in a.state)
        assert torch.equal(a.evaluation.truth[0], b.evaluation.truth[0])
        assert b.evaluation.baseline[0].device.type == "meta"  # held: its shape, not its values


def test_preparation_past_its_bound_is_a_problem_failure_naming_the_step(tmp_path):
    ledger = bounded("level1/1_P.py", "verified", 5.0)
    ledger.deadline = time.monotonic() - 1  # already spent
    with pytest.raises(PreparationTimeout) as info:
        _prepare(tmp_path, GELU, ledger=ledger)
    message = str(info.value)
    assert message.startswith("level1/1_P.py: preparing it for the verified protocol ran past its 5 s")
    assert "(--prepare-timeout) in calibration (default)" in message


@pytest.mark.parametrize("block", [rng_isolated, lambda: precision_policy("fp32")], ids=["seeded", "precision"])
def test_a_wait_for_another_lanes_block_is_waited_time_not_preparations_own(block):
    """Two lanes of one process: the other lane's seeded (or precision) block keeps this lane's out for
    0.4 s. Those seconds belong to the other pair: they move this pair's deadlines on, and the bound on
    preparation does not run out on them; the ledger shows them as waited."""
    gate, seen = DeviceGate(), {}
    inside, left = threading.Event(), threading.Event()

    def other() -> None:
        with block():
            inside.set()
            time.sleep(0.4)
        left.set()

    def lane() -> None:
        inside.wait(timeout=5)
        with holding(gate):
            ledger = bounded("level1/1_P.py", "verified", 0.3)
            with block():
                seen["waited"] = waited_s()
            ledger.check()  # past 0.3 s of wall clock, nearly all of it the other lane's
            seen["summary"] = ledger.summary()

    run_lanes(other, lane)
    assert left.is_set()
    assert seen["waited"] > 0.3
    assert seen["summary"]["waited_s"] > 0.3


def test_the_heartbeat_names_the_step_preparation_is_in(tmp_path, monkeypatch):
    """What a run that waits says: `prepare: truth 6/10 (large)`, read from the pair's clock."""
    from kbv.stages import StageClock, measuring, stage

    clock = StageClock()
    seen: list[str] = []
    real = CallLedger.count

    def glance(self: CallLedger, precision: str) -> None:  # at every reference call, what a glance shows
        where = clock.now()
        seen.append(where[0] if where else "")
        real(self, precision)

    monkeypatch.setattr(CallLedger, "count", glance)
    with measuring(clock), stage("prepare"):
        _prepare(tmp_path, GELU)
    assert "prepare: truth 6/10 (large)" in seen and "prepare: screen (range)" in seen
    assert clock.now() is None and "prepare" in clock.seconds


def test_the_seconds_of_a_purpose_leave_out_those_of_the_purposes_inside_it():
    """Where preparing a problem went, in seconds: a trial's own work (its draws, its comparisons) apart
    from the truth calls made inside it, so a slow preparation names its cause (the float64 calls, the
    screen, or the truth moved to the host's memory)."""
    started = time.monotonic()
    ledger = CallLedger()
    with ledger.doing("trial", "default"):
        time.sleep(0.05)
        with ledger.doing("truth", "default"):
            time.sleep(0.6)
        time.sleep(0.05)
    with ledger.doing("hold", "default"):
        time.sleep(0.1)
    s = ledger.summary()["seconds_by_purpose"]
    # the trial's own 0.1 s, without the truth's 0.6 s inside it (a loaded machine only adds a little)
    assert s["truth"] >= 0.6 and 0.1 <= s["trial"] < 0.5 and s["hold"] >= 0.1
    assert sum(s.values()) <= time.monotonic() - started + 0.001 * len(s)  # each rounded to 0.1 ms


def test_work_a_purpose_queues_on_an_asynchronous_device_counts_as_its_own():
    """On a GPU a call returns before its kernels have run, and whatever waits for them next (a
    trial's comparison) used to get their seconds: an H100 sweep counted L1/68's float64 truth as 31 s
    of trial and 1 s of truth. The ledger waits for the device as a purpose ends."""
    queued = []  # seconds of device work queued and not yet done: a fake stream

    def synchronize() -> None:
        while queued:
            time.sleep(queued.pop())

    ledger = CallLedger(synchronize=synchronize)
    with ledger.doing("trial", "default"):
        with ledger.doing("truth", "default"):
            queued.append(0.5)  # the float64 forward, launched: it returns at once
        synchronize()  # the trial's comparison of outputs waits for it
    s = ledger.summary()["seconds_by_purpose"]
    assert s["truth"] >= 0.5 and s.get("trial", 0.0) < 0.2, s


@pytest.mark.gpu
def test_a_float64_truths_kernels_count_as_truth_on_the_gpu(tmp_path):
    """The same on a real device: the truth's seconds hold its float64 kernels, whose launch alone is
    a few microseconds. Eight float64 GEMMs of 4096^3 a forward, and no parameters (a build costs
    nothing); the truth calls preparation made must have taken at least 70% of what as many forwards
    take, timed here."""
    deep = ("import torch, torch.nn as nn\nclass Model(nn.Module):\n    def forward(self, x, w):\n"
            "        for _ in range(8):\n            x = torch.tanh(x @ w / 64)\n        return x\n"
            "def get_inputs():\n    return [torch.randn(4096, 4096), torch.randn(4096, 4096)]\n"
            "def get_init_inputs():\n    return []\n")
    summary = _prepare(tmp_path, deep, device="cuda").ledger.summary()
    calls = summary["by_precision"]["float64"]
    x, w = (torch.randn(4096, 4096, device="cuda", dtype=torch.float64) for _ in range(2))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(8):
        x = torch.tanh(x @ w / 64)
    torch.cuda.synchronize()
    one = time.perf_counter() - t0
    assert summary["seconds_by_purpose"]["truth"] >= 0.7 * calls * one, (summary, one)


@pytest.mark.parametrize("slow_move", [False, True])
def test_truth_goes_to_host_memory_only_where_moving_it_costs_less_than_making_it_again(tmp_path, monkeypatch,
                                                                                        slow_move):
    """A plan that keeps the trials' truth in host memory (a GPU short of room) moves each truth there
    once and back for each candidate. On an H100, KernelBench's L1/9 spent 47 of its 50 s of preparation
    moving ten 4 GiB truths, each made in 0.2 s: where a move takes longer than making the trial, every
    trial's truth is made again for each candidate instead, the ones already moved included."""
    from kbv.protocols.verified.prepare import TrialData

    if slow_move:  # a CPU's move is free: a slow one, as a GPU's of GBs to pageable memory
        real = TrialData.settle

        def settle(self, hold, truth_home=None):
            if truth_home is not None:
                time.sleep(0.3)
            real(self, hold, truth_home)

        monkeypatch.setattr(TrialData, "settle", settle)
    path = write_tree(tmp_path, {"level1/1_P.py": GELU}) / "level1" / "1_P.py"
    problem = load_problem_file(path)
    plan = VerifiedPlan(Hold.TRUTH, 10, "host", 1 << 30, Need(0, 0))
    prepared = prepare_trials(problem, VerifiedProtocol(), torch.device("cpu"), b"\x07" * 16, plan=plan,
                              footprint=problem_footprint(problem))
    record = prepared.host_hold.record()
    made = prepared.ledger.total
    for t in prepared.trials:  # what a candidate's correctness reads
        assert t.evaluation.truth
        t.release()
    if slow_move:
        assert record["host_truth"] == "made again for each candidate" and record["host_move_s"] >= 0.3
        assert all(t.hold is Hold.NONE and t.truth_home is None for t in prepared.trials)
        assert prepared.ledger.total - made == 20  # a baseline and a truth for each trial
    else:
        assert record["host_truth"] == "kept in host memory"
        assert all(t.hold is Hold.TRUTH and t.truth_home == torch.device("cpu") for t in prepared.trials)
        assert prepared.ledger.total == made


def test_a_prepared_problem_says_where_its_seconds_went(tmp_path):
    s = _prepare(tmp_path, GELU, Hold.TRUTH).ledger.summary()["seconds_by_purpose"]
    assert {"truth", "baseline", "screen", "trial", "hold"} <= set(s), s


def test_a_deterministic_references_reruns_cost_the_screen_no_pass_over_their_outputs(tmp_path, monkeypatch):
    """The screen reruns the reference on a trial's inputs (determinism, state kept across calls). A
    rerun bitwise equal to the trial's baseline is judged from the baseline's own figures, with no
    float64 pass over a possibly multi-GB output: the screen was the largest share of preparing
    KernelBench's L1/12 on a CPU (9.4 s of 22 s). A reference that differs is measured as before
    (tests/test_soundness.py: the noisy and the stateful problems)."""
    import kbv.detect.soundness as soundness

    drifts: list[int] = []
    real = soundness.measure_error
    monkeypatch.setattr(soundness, "measure_error", lambda truth, out: drifts.append(1) or real(truth, out))
    prepared = _prepare(tmp_path, GELU)
    assert drifts == [] and prepared.screen is not None and prepared.screen.flags == ()
