"""Warming a GPU's clocks before a timed window (kbv.clocks): the stopping rule, the busy loop on a
simulated device whose clock climbs as DVFS makes it, and (`gpu`) the real thing on a device."""

from __future__ import annotations

import time

import pytest
import torch

from kbv.clocks import FALLBACK_MS, SETTLE_MS, ClockWarmup, clocks_settled, keep_busy, warm_clocks


class RampingDevice:
    """An idle GPU (345 MHz) whose SM clock climbs 150 MHz per `step_ms` of load up to `cap_mhz`
    (a power cap below the maximum when it is lower); `busy` is a burst of `burst_ms` of work."""

    def __init__(self, cap_mhz: int, max_mhz: int = 1980, burst_ms: float = 2.0, step_ms: float = 10.0) -> None:
        self.cap, self.max, self.burst, self.step = cap_mhz, max_mhz, burst_ms, step_ms
        self.loaded_ms = 0.0
        self.bursts = 0

    def busy(self) -> None:
        time.sleep(self.burst / 1e3)
        self.loaded_ms += self.burst
        self.bursts += 1

    def read(self) -> tuple[int, int]:
        return min(self.cap, 345 + 150 * int(self.loaded_ms / self.step)), self.max


def every(ms: float, clocks: list[int], start: float = 0.0) -> list[tuple[float, int]]:
    """Readings `ms` apart, from `start` ms of load on."""
    return [(start + ms * i, mhz) for i, mhz in enumerate(clocks)]


def test_a_boosted_clock_stops_the_warmup_at_once_and_an_idle_one_does_not():
    assert clocks_settled([(1.0, 1980)], 1980)
    assert clocks_settled([(1.0, 1800)], 1980)  # 91% of the maximum
    # the idle clock repeated before DVFS has had time to react is not a settled one
    assert not clocks_settled(every(10, [345] * 5), 1980)
    assert not clocks_settled([], 1980)


def test_a_clock_held_below_the_maximum_under_load_is_settled_once_dvfs_had_time():
    capped = every(15, [1400, 1410, 1405, 1400, 1402], start=SETTLE_MS)
    assert clocks_settled(capped, 1980)
    assert not clocks_settled(capped[:3], 1980)  # held for 30 ms: not yet a span
    assert not clocks_settled(every(15, [900, 1100, 1300, 1500, 1700], start=SETTLE_MS), 1980)  # climbing
    # a climb in steps holds each step for a few readings: that is no plateau
    steps = every(2, [1000] * 5 + [1150] * 5 + [1300] * 5 + [1450] * 5 + [1600] * 6, start=SETTLE_MS)
    assert not clocks_settled(steps, 1980)


def test_the_warmup_runs_until_the_clock_is_boosted_and_reports_it():
    device = RampingDevice(cap_mhz=1980)
    warmed = keep_busy(device.busy, device.read, max_ms=2000)
    assert warmed.sm_mhz_before == 345
    assert warmed.sm_mhz is not None and warmed.sm_mhz >= 0.9 * 1980
    assert warmed.max_mhz == 1980
    assert device.loaded_ms >= 100  # it took ~11 steps of 10 ms of load to climb
    assert warmed.warmed_ms < 2000  # and stopped there, long before its bound
    assert "345 -> " in warmed.describe() and "of 1980" in warmed.describe()


def test_a_capped_clock_ends_the_warmup_once_steady_and_a_stuck_one_at_the_bound():
    capped = RampingDevice(cap_mhz=1200)
    warmed = keep_busy(capped.busy, capped.read, max_ms=2000)
    assert warmed.sm_mhz == 1200 and warmed.warmed_ms < 2000
    stuck = RampingDevice(cap_mhz=345, step_ms=1e9)  # never climbs, never settles before SETTLE_MS
    bounded = keep_busy(stuck.busy, stuck.read, max_ms=50)
    assert bounded.warmed_ms >= 50 and bounded.warmed_ms < 50 + SETTLE_MS


def test_without_nvml_the_device_is_kept_busy_a_fixed_time_and_the_verdict_says_the_clocks_were_not_read():
    device = RampingDevice(cap_mhz=1980)
    warmed = keep_busy(device.busy, None, max_ms=5000)
    assert warmed.sm_mhz is None and warmed.sm_mhz_before is None
    assert FALLBACK_MS <= warmed.warmed_ms < FALLBACK_MS + 100
    assert "could not be read" in warmed.describe()
    assert ClockWarmup(None, None, None, 150.0).evidence() == {
        "sm_mhz_before": None, "sm_mhz": None, "max_mhz": None, "warmed_ms": 150.0}


def test_nvml_that_stops_answering_midway_falls_back_to_the_fixed_busy_time():
    device = RampingDevice(cap_mhz=1980, step_ms=1e9)  # would never boost
    calls = []

    def flaky() -> tuple[int, int]:
        calls.append(1)
        if len(calls) > 3:
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
        return device.read()

    warmed = keep_busy(device.busy, flaky, max_ms=5000)
    assert warmed.sm_mhz is None and warmed.sm_mhz_before is None
    assert FALLBACK_MS <= warmed.warmed_ms < FALLBACK_MS + 100
    refused = keep_busy(device.busy, lambda: (_ for _ in ()).throw(RuntimeError("refused")), max_ms=5000)
    assert refused.sm_mhz is None and refused.warmed_ms < FALLBACK_MS + 100


def test_a_run_timed_on_cold_clocks_never_resumes_into_a_warmed_one(tmp_path):
    from kbv.protocols.standard import StandardProtocol, StandardRunner
    from kbv.protocols.verified.rules import VerifiedProtocol
    from kbv.protocols.verified.runner import VerifiedRunner
    from kbv.protocols.verified.timer import TimerConfig
    from kbv.settings import Settings

    warm = Settings(device="cpu", run_dir=tmp_path, cache_dir=tmp_path)
    cold = Settings(device="cpu", run_dir=tmp_path, cache_dir=tmp_path, warm_clocks=False)
    std = [StandardRunner(StandardProtocol(), s).fingerprint() for s in (warm, cold)]
    ver = [VerifiedRunner(VerifiedProtocol(), TimerConfig(), ("eager-tf32",), s, b"k").fingerprint() for s in (warm, cold)]
    # the default: the protocol's rules and the baseline timed beside every candidate (verdicts from when
    # it was timed once per problem never resume into a run)
    assert std[0] == StandardProtocol().fingerprint() + "+baseline-bracketed"
    assert std[1] != std[0] and ver[1] != ver[0] and std[1].endswith("+no-warm-clocks")


def test_a_cpu_has_no_clocks_to_warm():
    assert warm_clocks("cpu") is None


@pytest.mark.gpu
def test_a_gpu_is_warmed_to_a_boosted_or_settled_clock():
    warmed = warm_clocks("cuda:0")
    assert warmed is not None
    if warmed.sm_mhz is not None:  # nvidia-ml-py is there: the clock was read before and after
        assert warmed.max_mhz and warmed.sm_mhz >= warmed.sm_mhz_before * 0.98
        assert warmed.warmed_ms <= 700
