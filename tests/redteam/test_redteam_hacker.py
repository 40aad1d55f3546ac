"""The hacker model: the prompt it gets, how its reply becomes a mutant, and the generation client's
cache and errors, against `kbv generate`'s loopback chat server."""

from __future__ import annotations

from pathlib import Path

import pytest
from chat_server import ChatServer, Scripted
from hackers import replay_hack
from redteam_targets import CPU_HONEST, targets

from kbv.errors import UsageError
from kbv.generate.client import RetryPolicy
from kbv.redteam import Breaks, Mutant, NotApplicable
from kbv.redteam.hacker import PUBLIC_RULES, HackerConfig, declared_breaks, hack, hack_prompt


@pytest.fixture
def chat_server() -> ChatServer:
    server = ChatServer()
    yield server
    server.close()


def _config(server: ChatServer, tmp_path: Path, **kwargs: object) -> HackerConfig:
    return HackerConfig(model="hacker", base_url=server.url, cache_dir=tmp_path / "cache",
                        retry=RetryPolicy(max_retries=1, base_delay_s=0.01), **kwargs)  # type: ignore[arg-type]


def test_the_prompt_holds_the_problem_the_candidate_and_the_public_rules() -> None:
    target = targets(CPU_HONEST, "cpu")[0]
    prompt = hack_prompt(target)
    assert PUBLIC_RULES in prompt and target.honest.code.strip() in prompt
    assert "class Model(nn.Module)" in prompt and "# kbv:" not in prompt  # the harness's directives are not shown
    assert "BREAKS: speed" in prompt


def test_declared_breaks_reads_the_last_line_and_defaults_to_speed() -> None:
    assert declared_breaks("BREAKS: truth") is Breaks.TRUTH
    assert declared_breaks("**BREAKS**: speed\nlater BREAKS: truth\nBREAKS: Speed") is Breaks.SPEED
    assert declared_breaks("no declaration") is Breaks.SPEED


def test_a_reply_becomes_a_model_mutant_and_a_rerun_asks_nothing(chat_server: ChatServer, tmp_path: Path) -> None:
    chat_server.on("hacker", replay_hack)
    chosen = targets(CPU_HONEST, "cpu")[:2]
    made = hack(_config(chat_server, tmp_path), chosen)
    assert [t for t, _ in made] == list(chosen)
    for target, mutant in made:
        assert isinstance(mutant, Mutant) and mutant.transformation == "model:hacker"
        assert mutant.breaks is Breaks.SPEED and "class ModelNew(_Honest)" in mutant.code
        assert mutant.honest is target.honest
    assert len(chat_server.requests_for("hacker")) == 2
    again = hack(_config(chat_server, tmp_path), chosen)  # answered from the response cache
    assert len(chat_server.requests_for("hacker")) == 2 and [m.code for _, m in again] == [m.code for _, m in made]


def test_no_code_and_failed_requests_are_not_applicable(chat_server: ChatServer, tmp_path: Path) -> None:
    chat_server.on("hacker", "I would rather not.", Scripted(status=400, content="bad request"))
    chosen = targets(CPU_HONEST, "cpu")[:2]
    outcomes = [m for _, m in hack(_config(chat_server, tmp_path, concurrency=1, use_cache=False), chosen)]
    assert all(isinstance(m, NotApplicable) for m in outcomes)
    assert "no python block" in outcomes[0].reason and "request failed" in outcomes[1].reason  # type: ignore[union-attr]


def test_an_endpoint_that_refuses_the_run_is_a_usage_error(chat_server: ChatServer, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="refused the request for model 'hacker'"):  # no script: 404
        hack(_config(chat_server, tmp_path, use_cache=False), targets(CPU_HONEST, "cpu")[:1])
