"""The verified protocol's rules: every factor and threshold, in one versioned record and beside it.

`VerifiedProtocol` is what a verdict's `protocol_version` and the resume key cover. The constants
below are the detectors' thresholds (`kbv.detect`) and the pipeline's fixed choices; changing one is
a change of protocol, so `PROTOCOL_VERSION` moves with them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from kbv.compare import Tolerance
from kbv.protocols import fingerprint

PROTOCOL_VERSION = "kbv-verified-1.7"  # 1.7: the reuse probe keeps structural zeros, and calls only a stale result a cache

# correctness
SENTINEL = -7.3e37  # the second run's poison: a value no honest kernel writes
POISON_MAGNITUDE = 1e30  # beyond this (or NaN, infinite) where the truth is not and two runs differ: poison shows
# A failing trial lost precision (rather than computing another function) when every failing output
# errs, in both measures, within this x what the reference itself errs in bfloat16 on the same trial
# (`Reference.bf16_errors`). That copy rounds to bf16 after every op, as often as a bf16 kernel of the
# same ops that keeps PyTorch's fp32 accumulation. On an L2/27-shaped problem (Conv3d, HardSwish, ReLU,
# softmax over 16 channels, mean), per trial and the worse measure: bf16 operands with fp32 math
# <= 0.8x its error, fp16 <= 0.2x, bf16 throughout 1.0-1.4x, the softmax's sums in bf16 too <= 2.2x;
# the fp32 fallback of a real L2/27 kernel that skips the ReLU 5-11x (4.5x over 8 channels). 3x sits
# between; a kernel that truncates to bf16 after every op (1.2-3.8x) is value_mismatch on some trials.
# TODO: measured on a CPU and on one problem's shape; measure on a GPU and over the suite.
PRECISION_LOSS_FACTOR = 3.0
# Where the reference cannot run in bfloat16 (an op without a bf16 kernel): a failing normwise error
# under this is precision lost. Not applied beside the factor: bf16 math itself errs past it (a softmax
# over large inputs), and an honest bf16 kernel there is no wrong function.
PRECISION_LOSS_BELOW = 1e-2
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
# a call too short to time against the window's costs (`kbv.detect.speed.too_short_to_time`): its median,
# once they are taken out, is within the CUDA events' own resolution (about half a microsecond), or
# within this many times the spread of those costs from round to round (what taking them out is unsure
# by), or they exceeded its own quickest window in at least this share of its rounds
EVENT_RESOLUTION_MS = 0.0005
WINDOW_NOISE_FACTOR = 2.0
CAPPED_ROUNDS_SHARE = 0.5

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
