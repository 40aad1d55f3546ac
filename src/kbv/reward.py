"""Rewards for RL: the callable a trainer calls, and the rules that turn a verdict into a number.

The rules (`RewardRule`, `RULES`, `reward_rule`, `DEFAULT_RULE`: `kernelbench-rl`, `log-speedup`,
`correct`, each named and versioned) live in `kbv.reward_rules`, which the service and the answers
import; they are re-exported here, where users look for them.

`RewardFunction` is the trainer's side: a callable `(completions, **kwargs) -> list[float]` as TRL's
GRPOTrainer calls its reward functions, and `compute_score` as verl calls a custom reward function;
it extracts each completion's code block as `kbv generate` does and asks a `kbv serve` for the rewards.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kbv.client import Client
from kbv.errors import UsageError
from kbv.reward_rules import (
    CORRECT_BONUS,
    DEFAULT_RULE,
    LOG_FLOOR,
    PASSING,
    RULES,
    RewardRule,
    reward_rule,
)

__all__ = ["CORRECT_BONUS", "DEFAULT_RULE", "LOG_FLOOR", "PASSING", "RULES", "RewardFunction", "RewardRule",
           "completion_text", "reward_rule"]


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
