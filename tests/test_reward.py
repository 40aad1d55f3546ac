"""Reward rules (pure functions of a verdict) and RewardFunction's side of a trainer's call, against a
client that answers from a table; `tests/serve/test_serve_http.py` runs it against a live service."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest

from kbv.errors import UsageError
from kbv.reward import RULES, RewardFunction, completion_text, reward_rule
from kbv.answer import Answer
from kbv.verdict import Status, Verdict

BASE = Verdict(problem="L1/2_ReLU", problem_hash="ph", level=1, candidate="c", candidate_hash="ch",
               protocol="verified", protocol_version="v", status=Status.VERIFIED, speedup=2.0)
CODE = "import torch\n\n\nclass ModelNew(torch.nn.Module):\n    pass\n"


@pytest.mark.parametrize("name, speedup, expected", [
    ("kernelbench-rl", 2.0, 2.3), ("kernelbench-rl", 0.5, 0.8), ("kernelbench-rl", None, 0.3),
    ("log-speedup", 1.0, 1.0), ("log-speedup", 2.0, 1 + math.log(2)), ("log-speedup", 0.01, 0.1),
    ("log-speedup", None, 0.1), ("log-speedup", math.inf, 0.1), ("correct", 0.01, 1.0),
])
def test_a_passed_verdict_earns_the_rule_s_formula(name, speedup, expected):
    assert reward_rule(name).reward(replace(BASE, speedup=speedup)) == pytest.approx(expected)


@pytest.mark.parametrize("status", [s for s in Status if s is not Status.VERIFIED])
def test_anything_not_verified_earns_nothing_under_the_verified_protocol(status):
    for rule in RULES.values():
        assert rule.reward(replace(BASE, status=status, speedup=3.0)) == 0.0


def test_under_the_standard_protocol_correct_passes_and_verified_is_not_its_status():
    standard = replace(BASE, protocol="standard", status=Status.CORRECT)
    assert reward_rule("kernelbench-rl").reward(standard) == pytest.approx(2.3)
    assert reward_rule("correct").reward(replace(standard, status=Status.VERIFIED)) == 0.0


def test_an_unknown_rule_is_a_usage_error_with_a_suggestion():
    with pytest.raises(UsageError, match="Unknown reward 'log-sppedup'.*Did you mean log-speedup"):
        reward_rule("log-sppedup")
    assert reward_rule(" Correct ").name == "correct"


def test_completion_text_reads_strings_and_conversations():
    assert completion_text("hi") == "hi"
    conversation = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a1"},
                    {"role": "tool", "content": "t"}, {"role": "assistant", "content": "a2"}]
    assert completion_text(conversation) == "a2"
    assert completion_text([{"content": "only"}]) == "only" and completion_text([]) == ""


class TableClient:
    """Answers every item from `rewards[(problem, code)]`, and records the batches it was sent."""

    def __init__(self, rewards: dict[tuple[str, str], float], max_batch: int = 100) -> None:
        self.rewards = rewards
        self.batches: list[list[dict[str, str]]] = []
        self.max_batch = max_batch

    def health(self) -> dict[str, Any]:
        return {"limits": {"max_code_bytes": 200, "max_batch": self.max_batch}}

    def evaluate_batch(self, items: list[dict[str, str]]) -> list[Answer]:
        self.batches.append(items)
        return [Answer(i["problem"], i["protocol"], {"verified": BASE}, self.rewards[(i["problem"], i["code"])],
                       "kernelbench-rl", 1, False) for i in items]

    def close(self) -> None:
        pass


def _reply(code: str) -> str:
    return f"Here is my kernel:\n```python\n{code}```\nIt is fast."


def test_trl_call_rewards_each_completion_from_its_problem_column_and_skips_replies_without_code():
    other = CODE.replace("pass", "x = 1")
    client = TableClient({("L1/2_ReLU", CODE): 2.5, ("L1/4_GELU", other): 0.7})
    reward = RewardFunction("http://unused", client=client)  # type: ignore[arg-type]
    completions = [_reply(CODE), "I cannot do this.", [{"role": "assistant", "content": _reply(other)}], _reply(CODE)]
    rewards = reward(completions, prompts=["p"] * 4, problem=["L1/2_ReLU", "L1/2_ReLU", "L1/4_GELU", "L1/2_ReLU"])
    assert rewards == [2.5, 0.0, 0.7, 2.5]
    assert len(client.batches) == 1 and len(client.batches[0]) == 2  # no-code skipped, duplicates once
    assert {i["protocol"] for i in client.batches[0]} == {"verified"}
    assert reward.last_answers[1] is None and reward.last_answers[0].reward == 2.5
    assert reward.__name__ == "kbv_reward"


def test_code_over_the_service_limit_earns_zero_without_a_request_and_batches_are_split():
    big = CODE + "# " + "x" * 300 + "\n"
    codes = [CODE.replace("pass", f"y = {i}") for i in range(5)]
    client = TableClient({("L1/2_ReLU", c): float(i) for i, c in enumerate(codes)}, max_batch=2)
    reward = RewardFunction("http://unused", problems="L1/2_ReLU", client=client)  # type: ignore[arg-type]
    assert reward([_reply(big)] + [_reply(c) for c in codes]) == [0.0, 0.0, 1.0, 2.0, 3.0, 4.0]
    assert [len(b) for b in client.batches] == [2, 2, 1]


def test_verl_compute_score_reads_ground_truth_or_extra_info_one_or_batched():
    client = TableClient({("L1/2_ReLU", CODE): 1.5})
    reward = RewardFunction("http://unused", client=client)  # type: ignore[arg-type]
    assert reward.compute_score("kbv", _reply(CODE), "L1/2_ReLU") == 1.5
    assert reward.compute_score(data_source="kbv", solution_str=_reply(CODE), ground_truth=None,
                                extra_info={"problem": "L1/2_ReLU"}) == 1.5
    batch = reward.compute_score(data_sources=["kbv"] * 2, solution_strs=[_reply(CODE), "no code"],
                                 ground_truths=["L1/2_ReLU", "L1/2_ReLU"], extra_infos=[None, None])
    assert batch == [1.5, 0.0]


def test_a_completion_without_a_problem_key_is_a_usage_error_not_a_zero():
    reward = RewardFunction("http://unused", client=TableClient({}))  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="no problem key for every completion in the 'problem' column"):
        reward([_reply(CODE), _reply(CODE)], problem=["L1/2_ReLU", None])
    with pytest.raises(UsageError):
        reward([_reply(CODE)])
