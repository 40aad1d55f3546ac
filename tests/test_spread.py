"""The verified speedup and its interval (kbv.protocols.verified.spread): the ratio of the medians,
the bootstrap's interval over the calls, widened by what two alike processes differ by, the host's
share of each side's windows included."""

from __future__ import annotations

import math

import pytest
import torch

from kbv.protocols.verified.spread import host_share, judge_speedups, process_note, process_spread, widen
from kbv.sandbox.timers import WindowCosts

COSTS = WindowCosts(launch=0.0155, sync=0.0155)  # an H100's, ms


def _steady(ms: float, n: int = 200) -> list[float]:
    """`n` calls of one process, spread 3% about `ms` (a fixed draw)."""
    gen = torch.Generator().manual_seed(int(ms * 1e6))
    return [ms * (1.0 + 0.03 * float(x)) for x in torch.randn(n, generator=gen)]


def _alike(share: float | None) -> dict[str, float | None]:
    return {"candidate": share, "eager-tf32": share}


def test_speedups_are_judged_only_between_sides_that_were_timed():
    cand, base = [0.005] * 40, [0.004] * 40
    speedups, cis = judge_speedups(cand, {"eager-tf32": base, "compile": [0.0] * 40}, 1.0, {"compile"})
    assert speedups == {"eager-tf32": pytest.approx(0.8)} and set(cis) == {"eager-tf32"}
    charged, _ = judge_speedups(cand, {"eager-tf32": base}, 2.0, set())
    assert charged["eager-tf32"] == pytest.approx(0.4)


def test_an_identitys_interval_holds_what_two_alike_processes_differ_by():
    # an H100's alike reference children of L1/2_ReLU: 8.14 and 8.77 us once 31.1 us of costs are taken out of
    # their windows (docs/gpu/2026-12-07). Over their calls alone the interval leaves 1.00 out
    cand, base = _steady(0.00877), _steady(0.00814)
    _, calls_only = judge_speedups(cand, {"eager-tf32": base}, 1.0, set())
    speedups, cis = judge_speedups(cand, {"eager-tf32": base}, 1.0, set(), _alike(0.0311))
    lo, hi = cis["eager-tf32"]
    assert calls_only["eager-tf32"][1] < 1.0 < hi and lo < speedups["eager-tf32"] < hi
    # milliseconds-long calls: the costs are a sliver of them, and the interval stays a few percent wide
    _, cis = judge_speedups(_steady(8.22), {"eager-tf32": _steady(8.13)}, 1.0, set(), _alike(0.030))
    lo, hi = cis["eager-tf32"]
    assert lo <= 1.0 <= hi and hi / lo < 1.04
    # on a CPU (no costs taken out) the processes' own share of the figure alone; a charged wall clock divides
    # the interval with the speedup
    assert process_spread(1.0, None) == pytest.approx(0.005)
    speedups, cis = judge_speedups(_steady(1.0), {"eager-tf32": _steady(2.0)}, 2.0, set())
    lo, hi = cis["eager-tf32"]
    assert lo < speedups["eager-tf32"] < hi and 0.96 < lo and hi < 1.04
    # the bootstrap's ends on either side of the figure, or none to widen around
    assert widen(1.0, (1.1, 1.2), 0.1) == pytest.approx((math.exp(-0.1), math.exp(math.hypot(math.log(1.2), 0.1))))
    assert widen(0.0, (0.0, 0.0), 0.1) == (0.0, 0.0) and widen(float("nan"), (1.0, 2.0), 0.1) == (1.0, 2.0)
    # however wide a side's spread, an end is a number, never an overflow
    lo, hi = widen(1.0, (0.9, 1.1), 1e6)
    assert 0.0 < lo < 1.0 < hi < math.inf


def test_a_launch_path_the_device_waits_on_widens_the_interval_by_the_hosts_share():
    # an H100's L3/1_MLP identity (docs/gpu/2026-12-07-b): 127.7 us against its baseline's 122.2 us once 31 us of
    # costs were taken out; with the window's costs alone as the host's share its interval left 1.00 out
    cand, base = _steady(0.1277, 400), _steady(0.1222, 400)
    _, costs_only = judge_speedups(cand, {"eager-tf32": base}, 1.0, set(), _alike(COSTS.launch + COSTS.sync))
    assert costs_only["eager-tf32"][1] < 1.0
    # its calls return to the host after about 120 us of launches, which the device waits on (stream 135 us,
    # windows 157 us)
    host = host_share(COSTS, [0.120] * 10, [0.135] * 10, [0.157] * 10)
    assert host == pytest.approx(0.1355)
    speedups, cis = judge_speedups(cand, {"eager-tf32": base}, 1.0, set(), _alike(host))
    lo, hi = cis["eager-tf32"]
    assert lo < speedups["eager-tf32"] < 1.0 < hi and hi / lo < 1.25
    assert "eager-tf32 135.5 us" in process_note(_alike(host)) and "host's share" not in process_note(_alike(None))
    # a call that returns at once and holds the device for milliseconds: its one launch, a sliver of its figure
    assert host_share(COSTS, [0.02] * 10, [2.0] * 10, [2.03] * 10) == pytest.approx(0.0155 + 0.02)
    assert process_spread(2.0, 0.0355) < 0.0055
    # no costs, no share (a CPU); no launch paths reported, the costs
    assert host_share(None, [0.1], [0.1], [0.1]) is None and host_share(COSTS, [], [], []) == pytest.approx(0.031)


def test_what_a_child_reports_of_its_launch_path_widens_its_interval_no_further_than_its_window():
    """A candidate's child says what its launch path took: the share counts no more of it than the
    device spent in the call's stream, no figure that is not a number, and never more than the side's
    median whole window, which the parent's wall clock bounds."""
    whole = [0.157] * 10
    assert host_share(COSTS, [5.0] * 10, [0.135] * 10, whole) == pytest.approx(0.0155 + 0.135)  # the stream's
    assert host_share(COSTS, [50.0] * 10, [math.nan] * 10, whole) == pytest.approx(0.031)  # no number: the costs
    assert host_share(COSTS, [50.0] * 10, [50.0] * 10, whole) == pytest.approx(0.157)  # the window's
    assert host_share(COSTS, [0.0] * 10, [0.0] * 10, whole) == pytest.approx(0.031)  # never below the costs
