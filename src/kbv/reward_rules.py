"""The reward rules: pure functions that turn a verdict into a number, each with a name and a version.

`kbv serve --reward NAME` picks one, and every answer (`kbv.answer.Answer`) stores the rule's name and
version beside the reward it gave. Every rule gives 0.0 to a verdict that did not pass its protocol:
under `verified`, anything but a `verified` status (incorrect, a hack, an integrity violation, no
custom kernel, a crash, a timeout, an unsound problem) earns nothing; under `standard`, anything but
`correct`. A passed verdict earns:

    kernelbench-rl (v1)   0.3 + speedup              a bonus for being correct plus the speedup over
                                                     the protocol's baseline (KernelBench-RL style)
    log-speedup (v1)      max(0.1, 1 + ln speedup)   1.0 at the baseline's speed, +0.69 a doubling;
                                                     correct but slow never earns less than 0.1
    correct (v1)          1.0                        pass or fail

A passed verdict without a speedup figure counts as having none: the bonus alone (0.3), the floor
(0.1), 1.0. A rule whose formula changes gets a new version, so stored rewards stay comparable.

The service (`kbv.serve`) rewards with them; `kbv.reward` re-exports them beside the trainer's side.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kbv.errors import UsageError, did_you_mean
from kbv.verdict import Status, Verdict

# The status that passes each protocol; nothing else earns a reward.
PASSING = {"standard": Status.CORRECT, "verified": Status.VERIFIED}
CORRECT_BONUS = 0.3  # kernelbench-rl
LOG_FLOOR = 0.1  # log-speedup: the least a passed verdict earns


@dataclass(frozen=True)
class RewardRule:
    """A named, versioned reward: `passed(speedup)` is what a passed verdict earns (speedup None
    when it has no figure); anything else earns 0.0."""

    name: str
    version: int
    formula: str  # for people: --help, /healthz, the README
    passed: Callable[[float | None], float]

    def reward(self, verdict: Verdict) -> float:
        """The reward of `verdict` under this rule."""
        if verdict.status is not PASSING.get(verdict.protocol):
            return 0.0
        speedup = verdict.speedup
        if speedup is None or not math.isfinite(speedup) or speedup <= 0:
            speedup = None
        return float(self.passed(speedup))

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "formula": self.formula}


def _kernelbench_rl(speedup: float | None) -> float:
    return CORRECT_BONUS + (speedup or 0.0)


def _log_speedup(speedup: float | None) -> float:
    return LOG_FLOOR if speedup is None else max(LOG_FLOOR, 1.0 + math.log(speedup))


RULES: dict[str, RewardRule] = {rule.name: rule for rule in (
    RewardRule("kernelbench-rl", 1, f"{CORRECT_BONUS:g} + speedup if passed, else 0", _kernelbench_rl),
    RewardRule("log-speedup", 1, f"max({LOG_FLOOR:g}, 1 + ln(speedup)) if passed, else 0", _log_speedup),
    RewardRule("correct", 1, "1 if passed, else 0", lambda speedup: 1.0),
)}
DEFAULT_RULE = "kernelbench-rl"


def reward_rule(name: str) -> RewardRule:
    """The rule called `name`. Raises UsageError naming the rules there are."""
    rule = RULES.get(name.strip().lower())
    if rule is None:
        raise UsageError(f"Unknown reward '{name}': expected {', '.join(RULES)}.{did_you_mean(name, RULES)}")
    return rule
