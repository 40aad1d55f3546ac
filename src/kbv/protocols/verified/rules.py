"""The verified protocol's rules: every factor and threshold, in one versioned record and beside it.

`VerifiedProtocol` is what a verdict's `protocol_version` and the resume key cover. The constants
below are the detectors' thresholds (`kbv.detect`) and the pipeline's fixed choices; changing one is
a change of protocol, so `PROTOCOL_VERSION` moves with them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from kbv.compare import Tolerance
from kbv.protocols import fingerprint

PROTOCOL_VERSION = "kbv-verified-1.3"

# correctness
SENTINEL = -7.3e37  # the second run's poison: a value no honest kernel writes
POISON_MAGNITUDE = 1e30  # beyond this (or NaN, infinite) where the truth is not and two runs differ: poison shows
PRECISION_LOSS_BELOW = 1e-2  # a failing normwise error under this is precision lost, not a wrong function
REUSE_FRACTIONS = (0.001, 0.01, 0.1)  # of the elements rewritten in place by each reuse probe
LATE_INPUT_CYCLES = 50_000_000  # ~25 ms of GPU spin before late-written inputs arrive
KEEP_BUDGET_BYTES = {"cuda": 8 << 30, "cpu": 1 << 30}  # all trials' tensors kept between candidates below this
# a changed parameter or buffer matches one of the reference's changes (BatchNorm's running statistics)
# when its sum and sum of squares agree within this share of their scale, or this much an element
STATE_RTOL = 1e-2
STATE_ATOL = 1e-5
# parameters are inputs too: constant-initialised ones are drawn per weight seed (`kbv.weights`)
DRAW_CONSTANT_PARAMETERS = True
# a distribution on which the baseline's own normwise error is this share of the output judges nothing:
# the tolerance it sets admits any answer of the right scale (a mean that rounds to zero, 1e8 x below
# its own rounding error)
JUDGES_NOTHING = 0.1
WEIGHT_COPIES = 1  # copies of the reference's weights a candidate may keep besides them (another layout)

# probes and attribution
REPLAY_PROBES = 3  # fresh input sets, each called twice unchanged
REPLAY_MIN_MS = 0.05  # below this, launch overhead dominates and the replay probe says nothing
REPLAY_RATIO = 0.3  # a second call this much faster than the first was replayed
ATTRIBUTION_SET = 100  # fresh input sets 100-102: warm-up, the profiled forward, the ghost replay

# the wall clock against the child's report (`kbv.detect.speed.wall_bound`)
CHARGE_RATIO = 1.15
CHARGE_SLACK_MS = 0.25
HACK_RATIO = 2.0
IMPOSSIBLE_FACTOR = 2.0  # x the device's measured copy bandwidth

# baselines: name -> (precision policy, torch.compile)
BASELINES = {"eager-tf32": ("tf32", False), "eager-fp32": ("fp32", False), "compile": ("tf32", True)}


@dataclass(frozen=True)
class VerifiedProtocol:
    """The verified protocol's configurable rules (see README, "The verified protocol, precisely")."""

    trials_per_distribution: int = 2
    tolerance: Tolerance = field(default_factory=Tolerance)
    precision: str = "tf32"  # the baseline's (and the candidate's) float32 policy: tf32 | fp32
    reuse_probes: int = 3  # same-pointer, new-value probes against result caches
    min_custom_share: float = 0.0  # least share of device time in the candidate's own kernels
    name: str = "verified"

    @property
    def version(self) -> str:
        return f"{PROTOCOL_VERSION}+{self.precision}"

    @property
    def primary_baseline(self) -> str:
        return f"eager-{self.precision}"

    def fingerprint(self) -> str:
        return fingerprint({**asdict(self), "version": PROTOCOL_VERSION})
