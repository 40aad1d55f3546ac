"""Rewards for RL: the rules that turn a verdict into a number, and the callable a trainer calls.

A rule is a pure function of one verdict, with a name and a version; `kbv serve --reward NAME` picks
one, and every answer stores the rule's name and version beside the reward it gave. Every rule gives
0.0 to a verdict that did not pass its protocol: under `verified`, anything but a `verified` status
(incorrect, a hack, an integrity violation, no custom kernel, a crash, a timeout, an unsound problem)
earns nothing; under `standard`, anything but `correct`. A passed verdict earns:

    kernelbench-rl (v1)   0.3 + speedup              a bonus for being correct plus the speedup over
                                                     the protocol's baseline (KernelBench-RL style)
    log-speedup (v1)      max(0.1, 1 + ln speedup)   1.0 at the baseline's speed, +0.69 a doubling;
                                                     correct but slow never earns less than 0.1
    correct (v1)          1.0                        pass or fail

A passed verdict without a speedup figure counts as having none: the bonus alone (0.3), the floor
(0.1), 1.0. A rule whose formula changes gets a new version, so stored rewards stay comparable.

`RewardFunction` is the trainer's side: a callable `(completions, **kwargs) -> list[float]` as TRL's
GRPOTrainer calls its reward functions, and `compute_score` as verl calls a custom reward function;
it extracts each completion's code block as `kbv generate` does and asks a `kbv serve` for the rewards.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kbv.errors import UsageError, did_you_mean
from kbv.verdict import Status, Verdict

if TYPE_CHECKING:
    from kbv.client import Client

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


# -- the trainer's side --------------------------------------------------------------------------

class RewardFunction:
    """Rewards from a `kbv serve` at `url`, for a trainer's batch of completions.

    - TRL: `GRPOTrainer(reward_funcs=[RewardFunction(url)], ...)`. TRL calls it with `completions`
      (strings, or conversations: lists of {"role", "content"} messages, whose last assistant message
      is read) and every other dataset column as a keyword argument of lists; the problem of each
      completion is the column `column` ("problem" by default), unless `problems` names one problem
      for them all. It has a `__name__`, which TRL logs the rewards under.
    - verl: `compute_score(data_source, solution_str, ground_truth, extra_info)` gives one reward,
      the problem being `ground_truth` (or `extra_info["problem"]`, or `problems`); called with the
      plural names (`solution_strs`, `ground_truths`, ...) as verl's batch reward manager does, it
      gives a list.

    Each completion's code is its last ```python block that defines ModelNew (`kbv generate`'s rule,
    `kbv.generate.extract`). A completion without one, or whose code is larger than the service takes,
    gets 0.0 without a request, as a failed candidate would. Everything else is sent in batches of
    the service's `max_batch`; identical completions are evaluated once. The answers of the last call
    are in `last_answers` (None where no request was made), for logging status and speedup.

    Raises ServiceError when the service cannot be reached or refuses a batch (after the client's
    retries on a full queue): a reward of 0 for a harness failure would teach the policy a lie.
    """

    def __init__(self, url: str, problems: str | None = None, *, column: str = "problem",
                 protocol: str = "verified", token: str | None = None, timeout_s: float = 3600.0,
                 client: Client | None = None) -> None:
        from kbv.client import Client

        self.problems = problems
        self.column = column
        self.protocol = protocol
        self.client = client or Client(url, token=token, timeout_s=timeout_s)
        self.__name__ = "kbv_reward"
        self.last_answers: list[Any] = []
        self._limits: dict[str, Any] | None = None

    # TRL
    def __call__(self, completions: Sequence[Any], **kwargs: Any) -> list[float]:
        problems = self._problems_of(len(completions), kwargs.get(self.column), None, where=f"the '{self.column}' column")
        return self.score([completion_text(c) for c in completions], problems)

    # verl
    def compute_score(self, data_source: Any = None, solution_str: str | None = None, ground_truth: Any = None,
                      extra_info: Mapping[str, Any] | None = None, **kwargs: Any) -> float | list[float]:
        if "solution_strs" in kwargs:  # the batch reward manager
            texts = list(kwargs["solution_strs"])
            problems = self._problems_of(len(texts), kwargs.get("ground_truths"), kwargs.get("extra_infos"),
                                         where="ground_truths")
            return self.score(texts, problems)
        problems = self._problems_of(1, [ground_truth], [extra_info], where="ground_truth")
        return self.score([solution_str or ""], problems)[0]

    def score(self, texts: Sequence[str], problems: Sequence[str]) -> list[float]:
        """The reward of each completion text for its problem, in order."""
        from kbv.generate.extract import extract_model_new

        limits = self._service_limits()
        codes = [extract_model_new(text) for text in texts]
        items = {}  # one request per distinct (problem, code)
        for code, problem in zip(codes, problems):
            if code is not None and len(code.encode("utf-8")) <= limits["max_code_bytes"]:
                items.setdefault((problem, code), None)
        todo = list(items)
        for start in range(0, len(todo), limits["max_batch"]):
            chunk = todo[start:start + limits["max_batch"]]
            answers = self.client.evaluate_batch([{"problem": p, "code": c, "protocol": self.protocol} for p, c in chunk])
            items.update(zip(chunk, answers))
        self.last_answers = [items.get((p, c)) if c is not None else None for c, p in zip(codes, problems)]
        return [a.reward if a is not None else 0.0 for a in self.last_answers]

    def _service_limits(self) -> dict[str, Any]:
        if self._limits is None:
            self._limits = dict(self.client.health()["limits"])
        return self._limits

    def _problems_of(self, n: int, column: Any, extra: Any, where: str) -> list[str]:
        """The problem of each of `n` completions: `problems`, else `column`, else extra_info's."""
        if self.problems is not None:
            return [self.problems] * n
        found = list(column) if column is not None else [None] * n
        extras = list(extra) if extra is not None else [None] * n
        for i, value in enumerate(found):
            if value is None and isinstance(extras[i] if i < len(extras) else None, Mapping):
                found[i] = extras[i].get("problem")
        if len(found) != n or any(not isinstance(p, str) or not p for p in found):
            raise UsageError(f"RewardFunction: no problem key for every completion in {where}; give the "
                             "problem per sample there, or RewardFunction(url, problems='L1/2_ReLU') for one problem.")
        return found

    def close(self) -> None:
        self.client.close()


def completion_text(completion: Any) -> str:
    """The text of a completion: a string as it is; a conversation (a list of {"role", "content"}
    messages, TRL's conversational format), its last assistant message (else its last message)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        return str(completion.get("content") or "")
    if isinstance(completion, Sequence) and completion:
        messages = [m for m in completion if isinstance(m, Mapping)]
        assistant = [m for m in messages if m.get("role") == "assistant"]
        chosen = (assistant or messages or [{}])[-1]
        return str(chosen.get("content") or "")
    return ""
