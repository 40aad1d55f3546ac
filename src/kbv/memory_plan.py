"""Memory that fits, decided before it is spent.

Before a protocol prepares a problem, the problem's footprint (`kbv.footprint`: shapes traced on the
meta device) says what its preparation and its candidates will hold, kbv's own copies included: the
float64 truth of every hidden trial, the trials' inputs and weights, the timing pool, the baseline
outputs, the standard protocol's five trials, and what the children hold beside the parent (a
candidate's and a baseline's copies of the inputs, their weights, their forwards' peaks). Where
everything fits, everything is held, as for small problems. Where it does not, the plan holds less:
the trials' truth alone (their inputs and weights remade from their seeds when needed: a draw and a
build, no reference call), on the device or, on a GPU, in the host's memory; then fewer of them, the
rest remade for each candidate; the pool at its minimum of two sets. Where even the least does not
fit, the problem is refused before anything is allocated, with the figures (`ProblemTooLarge`: a
stored problem failure, tried again when the run resumes).

Memory is what the operating system and the device say is available when the problem is prepared,
less a margin (`FIT_SHARE`): other processes on the machine keep theirs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from kbv.errors import ProblemRunError
from kbv.footprint import Footprint, format_bytes
from kbv.room import claim, others_claims, planning  # noqa: F401 (planning: the runners plan under it)

FIT_SHARE = 0.8  # of the memory available that one problem's plan may take
MIN_POOL_SETS = 2  # the timing pool never shares inputs between consecutive calls
# the comparison's temporaries: float64 chunks of `kbv.compare.CHUNK` elements, a few at a time
JUDGE_BYTES = 8 * 8 * (1 << 22)


class ProblemTooLarge(ProblemRunError):
    """A problem whose least plan needs more memory than is available (the message gives the figures)."""


class Hold(str, enum.Enum):
    """What a hidden trial keeps between candidates."""

    ALL = "all"  # inputs, weights, truth and baseline outputs
    TRUTH = "truth"  # the float64 truth (and the baseline's errors); inputs and weights remade from seeds
    NONE = "none"  # nothing: remade, reference calls and all, for each candidate


@dataclass(frozen=True)
class Available:
    """Bytes free now: on the device (None on a CPU, whose device is the host) and on the host."""

    device_bytes: int | None
    host_bytes: int

    def describe(self) -> str:
        host = f"{format_bytes(self.host_bytes)} of host memory"
        return host if self.device_bytes is None else f"{format_bytes(self.device_bytes)} of device memory, {host}"


def available_memory(device_type: str, device_index: int | None = None) -> Available:
    """What the device and the host have free now, less what the other lanes' pairs in flight claim
    (`kbv.room`: their plans' peaks, of which they may not have allocated everything yet)."""
    device_claims, host_claims = others_claims()
    if device_type != "cuda":
        host_claims += device_claims  # a CPU lane's device is the host
    host = max(host_available_bytes() - host_claims, 0)
    if device_type != "cuda":
        return Available(None, host)
    import torch

    free, _ = torch.cuda.mem_get_info(device_index if device_index is not None else torch.cuda.current_device())
    return Available(max(int(free) - device_claims, 0), host)


def claim_plan(need: Need) -> None:
    """The pair in hand will hold up to `need` (`kbv.room`): other lanes plan without it."""
    claim(need.device, need.host)


def host_available_bytes() -> int:
    """MemAvailable: what the kernel can give without swapping (a huge figure where unknown)."""
    return meminfo_bytes("MemAvailable") or 1 << 50


def host_total_bytes() -> int:
    """MemTotal (a huge figure where unknown)."""
    return meminfo_bytes("MemTotal") or 1 << 50


def return_cached(device_type: str) -> None:
    """Give this process's cached, unused device memory back to the driver. The plan's phases hold
    the parent's transients (a float64 reference call, a trial drawn for the child) one phase at a
    time, and the children allocate from the same device: a CUDA caching allocator would otherwise
    keep every phase's peak reserved beside the next, and a child would not find the room the plan
    left it. A synchronisation and a free; nothing on a CPU. PyTorch empties every device's cache at
    once: with several devices in one run, a lane's call frees the parent's unused blocks on the others
    too, a host-side step of the parent that launches nothing on them."""
    if device_type == "cuda":
        import torch

        torch.cuda.empty_cache()


def meminfo_bytes(name: str) -> int | None:
    """A line of /proc/meminfo, in bytes; None where it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(f"{name}:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass(frozen=True)
class Need:
    """Bytes a plan holds at its peak, on the device (0 on a CPU: everything counts as host) and the host."""

    device: int
    host: int

    def fits(self, available: Available) -> bool:
        if available.device_bytes is not None and self.device > FIT_SHARE * available.device_bytes:
            return False
        return self.host <= FIT_SHARE * available.host_bytes

    def describe(self, available: Available) -> str:
        """'needs about 37 GiB of host memory, 22 GiB free (a problem may take 80% of it)': the side
        that does not fit."""
        share = f"(a problem may take {FIT_SHARE:.0%} of it)"
        if available.device_bytes is not None and self.device > FIT_SHARE * available.device_bytes:
            return (f"needs about {format_bytes(self.device)} of device memory, "
                    f"{format_bytes(available.device_bytes)} free {share}")
        return f"needs about {format_bytes(self.host)} of host memory, {format_bytes(available.host_bytes)} free {share}"


@dataclass(frozen=True)
class VerifiedPlan:
    """How the verified protocol holds one problem: `held` trials keep `hold` (the rest keep nothing),
    their truth on `truth_home` ("device" or "host"); the timing pool takes at most `pool_budget_bytes`."""

    hold: Hold
    held: int
    truth_home: str
    pool_budget_bytes: int
    need: Need
    pool_held: bool = True  # the parent keeps the timing pool (else draws each set again when it needs it)

    def describe(self) -> str:
        pool = "" if self.pool_held else "; timing sets drawn again from their seeds"
        if self.hold is Hold.ALL:
            return "every trial held" + pool
        where = "" if self.truth_home == "device" else " in host memory"
        return (f"{self.held} trials' truth held{where}, inputs and weights remade from their seeds"
                if self.hold is Hold.TRUTH else "trials remade for each candidate") + pool


@dataclass(frozen=True)
class StandardPlan:
    """How the standard protocol holds one problem: `held` of its trials kept between candidates (the
    rest remade by the reference for each), on `home` ("device" or "host")."""

    held: int
    home: str
    need: Need


def _split(device: int, host: int, on_cuda: bool) -> Need:
    """On a CPU the device is the host: everything counts there."""
    return Need(device, host) if on_cuda else Need(0, device + host)


def verified_need(fp: Footprint, hold: Hold, held: int, truth_home: str, pool_sets: int, on_cuda: bool,
                  pool_held: bool = True, baselines: int = 1) -> Need:
    """What the verified protocol holds at its peak for a problem of footprint `fp`, `held` of its
    hidden trials keeping `hold`, with a timing pool of `pool_sets` input sets timed against
    `baselines` baseline children. Throughout: the held trials (on the host where `truth_home` is
    "host", a GPU), the parent's pool where it holds one, and the pool entries' truth the rechecks
    keep, and the reference's last build, kept for its seed's next. Beside that, the peak of the phases:

    - a reference call in the parent (a trial made, a remade one, a probe's or a recheck's truth): the
      model and inputs in fp32 and in float64 with the float64 forward's peak; then the truth beside
      the baseline's forward; the weights cloned for the candidate;
    - from the timing pool's making on, each baseline child holds the pool, the model and (on a GPU,
      whose caching allocator keeps it) its forward's peak, and the candidate's child its model and
      the last inputs it was handed;
    - judging a candidate: in the parent one trial and the two runs' outputs taken back and the
      comparison's chunks, or a reference call; in the candidate's child a forward and its outputs,
      and the first run's outputs held through the second (as a caller who kept them would);
    - handing the candidate's child the pool: a held pool in one transfer (the child holds it twice
      until it has cloned it), else a set at a time (one drawn in the parent, one in transfer);
    - attribution: three fresh sets, in transfer and cloned in the child, beside its forward; then
      the ghost replay's truth, a reference call;
    - timing: the candidate's forward, the rechecks' reference calls and comparisons;
    - the replay probe, a probe at a time: two fresh sets in transfer and cloned."""
    fp = fp.on("cuda" if on_cuda else "cpu")  # a CUDA forward's reductions stage their partial results
    per_trial = {Hold.ALL: fp.input_bytes + fp.weight_bytes + fp.truth_bytes + fp.output_bytes,
                 Hold.TRUTH: fp.truth_bytes, Hold.NONE: 0}[hold]
    kept = held * per_trial
    pool = pool_sets * fp.input_bytes
    inputs, forward = fp.input_bytes, fp.forward_bytes
    reference_call = fp.weight_bytes + max(fp.truth_call_bytes, inputs + fp.weight_bytes + fp.truth_bytes + forward)
    comparing = fp.truth_bytes + 2 * fp.output_bytes + JUDGE_BYTES
    kept_forward = forward if on_cuda else 0  # a CUDA allocator keeps a child's forward peak; a CPU's frees it
    lingering = 0 if on_cuda else 3 * inputs  # a CPU's shared copies of attribution's sets, until the next transfer
    # the children: each baseline's pool, model and forward; the candidate's model and the two input
    # sets it keeps (the last call's and the one before, for its integrity checks)
    timed = baselines * (pool + fp.weight_bytes + kept_forward) + fp.weight_bytes + 2 * inputs
    trial = inputs + fp.truth_bytes  # the trial being judged, in the parent (its weights: the reference call's)
    phases = {
        "preparing": reference_call,
        # a correctness call (its inputs in transfer beside the child's clone), or a reuse probe's
        # reference call beside the trial it rewrites
        "judging": timed + inputs + fp.output_bytes + trial + max(reference_call + kept_forward,
                                                                 3 * fp.output_bytes + JUDGE_BYTES + forward),
        "handing": timed + kept_forward + (2 * pool if pool_held else pool + 2 * inputs),
        "attribution": timed + pool + forward + 6 * inputs,
        "ghost": timed + pool + kept_forward + lingering + fp.output_bytes + reference_call,
        "timing": timed + pool + lingering + fp.output_bytes + max(reference_call + kept_forward, comparing + forward),
        "replay": timed + pool + forward + 4 * inputs,
    }
    rechecked = (pool_sets if hold is Hold.ALL else 1) * fp.truth_bytes
    # the reference's last build, kept for its seed's next build (`kbv.reference.Reference.build`)
    device = (pool if pool_held else 0) + rechecked + fp.weight_bytes + max(phases.values())
    if truth_home == "host" and on_cuda:
        return Need(device, kept)
    return _split(device + kept, 0, on_cuda)


def plan_verified(fp: Footprint, trials: int, available: Available, pool_budget_bytes: int,
                  problem: str, baselines: int = 1) -> VerifiedPlan:
    """The most the verified protocol can hold of a problem within `available`: every trial and the
    timing pool; else every trial's truth on the device; else (a GPU) in host memory; else fewer
    trials' truth; else none. The pool shrinks to its minimum first, and beyond every trial held the
    parent keeps none of it (each set is drawn again from its seed when needed). Raises
    ProblemTooLarge when nothing fits."""
    on_cuda = available.device_bytes is not None
    full_pool = max(MIN_POOL_SETS, min(16, pool_budget_bytes // max(fp.input_bytes, 1)))
    homes = ("device", "host") if on_cuda else ("device",)
    tries: list[tuple[Hold, int, str, int, bool]] = [(Hold.ALL, trials, "device", full_pool, True),
                                                     (Hold.ALL, trials, "device", MIN_POOL_SETS, True),
                                                     (Hold.ALL, trials, "device", MIN_POOL_SETS, False)]
    tries += [(Hold.TRUTH, trials, home, MIN_POOL_SETS, False) for home in homes]
    tries += [(Hold.TRUTH, k, homes[-1], MIN_POOL_SETS, False) for k in range(trials - 1, 0, -1)]
    tries.append((Hold.NONE, 0, "device", MIN_POOL_SETS, False))
    for hold, held, home, pool_sets, pool_held in tries:
        need = verified_need(fp, hold, held, home, pool_sets, on_cuda, pool_held, baselines)
        if need.fits(available):
            return VerifiedPlan(hold, held, home, pool_sets * max(fp.input_bytes, 1), need, pool_held)
    raise ProblemTooLarge(f"{problem}: too large for this machine under the verified protocol: it "
                          f"{need.describe(available)} with one hidden trial of {format_bytes(fp.input_bytes)} "
                          f"of inputs and {format_bytes(fp.truth_bytes)} of float64 truth made at a time")


def standard_need(fp: Footprint, held: int, home: str, on_cuda: bool) -> Need:
    """What the standard protocol holds at its peak: the parent's model, its held trials (inputs and
    reference outputs) and the timing inputs throughout; while preparing, a trial being made (its
    inputs and the reference's forward) or the baseline's child loading; while judging a candidate, a
    trial (made again where not held: its forward's peak), its reference, the output taken back and
    the comparison's chunks, beside the candidate's child and the baseline's, which is timed beside
    every candidate (each the model, the inputs, its forward)."""
    fp = fp.on("cuda" if on_cuda else "cpu")
    kept = held * (fp.input_bytes + fp.output_bytes)
    base = fp.weight_bytes + fp.input_bytes  # the model, the timing inputs
    making = fp.input_bytes + fp.forward_bytes
    preparing = max(making, fp.call_bytes)
    judging = max(making, fp.input_bytes + fp.output_bytes) + fp.output_bytes + JUDGE_BYTES + 2 * fp.call_bytes
    device = base + max(preparing, judging)
    if home == "host" and on_cuda:
        return Need(device, kept)
    return _split(device + kept, 0, on_cuda)


def plan_standard(fp: Footprint, trials: int, available: Available, problem: str) -> StandardPlan:
    """Every trial held on the device; else (a GPU) in host memory; else fewer; else one at a time,
    remade by the reference for each candidate (as KernelBench itself runs its trials). Raises
    ProblemTooLarge when even that does not fit."""
    on_cuda = available.device_bytes is not None
    homes = ("device", "host") if on_cuda else ("device",)
    tries = [(trials, home) for home in homes] + [(k, homes[-1]) for k in range(trials - 1, -1, -1)]
    for held, home in tries:
        need = standard_need(fp, held, home, on_cuda)
        if need.fits(available):
            return StandardPlan(held, home, need)
    raise ProblemTooLarge(f"{problem}: too large for this machine under the standard protocol: it "
                          f"{need.describe(available)} with one trial of {format_bytes(fp.input_bytes)} of inputs "
                          f"and {format_bytes(fp.output_bytes)} of outputs at a time")
