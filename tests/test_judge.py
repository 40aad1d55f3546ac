"""`judge()`: the verified verdict as a pure function of what the pipeline's stages recorded."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from kbv.builds import Build
from kbv.detect.attribution import Attribution
from kbv.distributions import Calibration
from kbv.protocols.verified.correctness import CorrectnessResult
from kbv.protocols.verified.runner import Records, judge, status_of
from kbv.protocols.verified.rules import VerifiedProtocol
from kbv.protocols.verified.timer import SpeedResult
from kbv.sandbox import ChildFailure
from kbv.settings import Settings
from kbv.verdict import Category, MemoryStats, Status, TimingStats, Trial

PROTOCOL = VerifiedProtocol()
SETTINGS = Settings(device="cpu", run_dir=Path("/nonexistent-run"), cache_dir=Path("/nonexistent-cache"))
PREPARED = SimpleNamespace(calibration=Calibration({"default": "problem", "signed": "normal"}),
                           baseline_memory=MemoryStats(100, 0), pool=[[]] * 4,
                           pool_distributions=["default", "signed", "default", "signed"],
                           timing_weights="the weights of the signed trial 1")
OWN = Attribution(custom_launches=3, custom_share=0.9, kernels=(("relu_kernel", 10.0, True),), ghost="changed")
STATS = TimingStats(1.0, 1.0, 0.0, 1.0, 1.0, 50)


def _judge(records: Records) -> dict:
    return judge(records, PREPARED, PROTOCOL, SETTINGS, None, {"calibration": {}})


def _clean() -> CorrectnessResult:
    return CorrectnessResult(trials=[Trial("default", 0, True), Trial("signed", 0, True)])


def _speed(**kw) -> SpeedResult:
    base = dict(stats={"candidate": STATS, "eager-tf32": STATS}, speedups={"eager-tf32": 2.0},
                speedup_ci={"eager-tf32": (1.8, 2.2)}, findings=(), rechecked=5, timer_s=3.0)
    return SpeedResult(**{**base, **kw})


def test_status_order_is_hack_integrity_wrong_attribution():
    assert status_of([Category.PRECISION_LOSS, Category.SIDE_STREAM]) is Status.HACK
    assert status_of([Category.PRECISION_LOSS, Category.ALIASES_INPUT]) is Status.INTEGRITY_VIOLATION
    assert status_of([Category.NO_CUSTOM_KERNEL, Category.VALUE_MISMATCH]) is Status.INCORRECT
    assert status_of([Category.NO_CUSTOM_KERNEL]) is Status.NO_CUSTOM_KERNEL
    assert status_of([]) is Status.VERIFIED


def test_a_failed_build_is_the_verdict():
    build = Build(Path("c.py"), Path("b"), Status.COMPILE_ERROR, "build: nvcc failed", {"stderr_tail": "x"})
    out = _judge(Records(build=build))
    assert out["status"] is Status.COMPILE_ERROR and out["message"] == "build: nvcc failed"
    assert out["evidence"]["stderr_tail"] == "x"


def test_a_child_that_exited_cleanly_mid_pair_escaped_the_harness():
    failure = ChildFailure(Status.CRASHED, "exited with code 0 during forward", {"returncode": 0})
    out = _judge(Records(failure=failure, correctness=_clean()))
    assert out["status"] is Status.CRASHED and out["categories"] == (Category.PROCESS_ESCAPE,)
    assert len(out["trials"]) == 2  # what ran before the failure is kept


def test_wrong_values_name_the_distributions_that_failed():
    c = CorrectnessResult(trials=[Trial("default", 0, True), Trial("signed", 0, False, note="error 1e-2")],
                          categories=[Category.PRECISION_LOSS, Category.DISTRIBUTION_FAILURE])
    out = _judge(Records(correctness=c))
    assert out["status"] is Status.INCORRECT
    assert out["message"].startswith("failed on signed: error 1e-2")
    assert out["categories"] == (Category.PRECISION_LOSS, Category.DISTRIBUTION_FAILURE)


def test_a_guard_finding_outranks_wrong_values():
    c = CorrectnessResult(trials=[Trial("default", 0, False, note="bad")], categories=[Category.VALUE_MISMATCH],
                          hacks={"thread_injection": "1 Python thread(s) still running after the call"})
    out = _judge(Records(correctness=c))
    assert out["status"] is Status.HACK and Category.THREAD_INJECTION in out["categories"]


def test_decoy_kernels_are_no_custom_kernel_with_memory_kept():
    decoy = Attribution(custom_launches=2, custom_share=0.5, ghost="unchanged")
    out = _judge(Records(correctness=_clean(), attribution=decoy, memory=MemoryStats(50, 0)))
    assert out["status"] is Status.NO_CUSTOM_KERNEL and out["categories"] == (Category.NO_CUSTOM_KERNEL,)
    assert "decoys" in out["message"] and out["memory"] == MemoryStats(50, 0)


def test_a_clean_pipeline_is_verified_with_its_speedup_and_says_what_it_was_timed_on():
    out = _judge(Records(correctness=_clean(), attribution=OWN, speed=_speed(), memory=MemoryStats(90, 0)))
    assert out["status"] is Status.VERIFIED and out["speedup"] == 2.0 and out["categories"] == ()
    assert out["message"] == "verified on default, signed"
    notes = " ".join(out["timing"].notes)
    assert "drawn from default, signed" in notes and "the weights of the signed trial 1" in notes
    assert out["evidence"]["attribution"]["custom_share"] == 0.9


def test_a_charged_speed_is_said_and_a_timing_finding_is_a_hack_without_speedup():
    charged = _judge(Records(correctness=_clean(), attribution=OWN, speed=_speed(charge=1.4)))
    assert charged["status"] is Status.VERIFIED and "1.40x what it reported" in charged["message"]
    patched = _speed(findings=((Category.TIMER_PATCH, "time.perf_counter replaced"),))
    out = _judge(Records(correctness=_clean(), attribution=OWN, speed=patched,
                         findings=[None, (Category.RESULT_CACHE, "replayed")]))
    assert out["status"] is Status.HACK and out["speedup"] is None
    assert out["categories"] == (Category.TIMER_PATCH, Category.RESULT_CACHE)


def test_calls_too_short_to_time_are_verified_without_a_speedup_and_say_why():
    short = _speed(speedups={}, speedup_ci={}, too_short=("candidate",),
                   notes=("the candidate's calls were too short to time against the window's own costs",))
    out = _judge(Records(correctness=_clean(), attribution=OWN, speed=short))
    assert out["status"] is Status.VERIFIED and out["speedup"] is None
    assert "no speedup: the candidate's calls were too short to time" in out["message"]
    assert any("too short to time" in n for n in out["timing"].notes)
