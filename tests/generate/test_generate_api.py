"""generate(): records, output files, the cache, concurrency (kbv.generate.api)."""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import pytest
from chat_server import ChatServer, Scripted, honest_reply

from kbv.candidates import has_code, load_candidates
from kbv.errors import UsageError
from kbv.generate import FakeChatClient, GenerateConfig, RetryPolicy, SamplingParams, generate
from kbv.generate.api import NO_CODE_MARKER, check_config, layout_file_name, read_jsonl
from kbv.generate.client import ChatError, ErrorKind, Reply, Usage
from kbv.problems import load_problems, make_problem

FAST = RetryPolicy(max_retries=2, base_delay_s=0.001, max_delay_s=0.002)
PROSE = "I would fuse these operators, but I am not able to write the code right now."


def config(problem_dir: Path, tmp_path: Path, **changes) -> GenerateConfig:
    base = GenerateConfig(problems=str(problem_dir), model="m", out_dir=tmp_path / "out", base_url="http://fake/v1",
                          retry=FAST, cache_dir=tmp_path / "cache", concurrency=2)
    return dataclasses.replace(base, **changes)


def honest_fake() -> FakeChatClient:
    """A fake that answers every problem with its own Model renamed ModelNew (correct, pure PyTorch)."""
    return FakeChatClient(lambda req: Reply(text=honest_reply({"messages": [{"content": req.messages[-1].content}]}),
                                            usage=Usage(100, 50)))


def lines(path: Path) -> list[dict]:
    return read_jsonl(path)


def test_statuses_files_and_jsonl(problem_dir, tmp_path):
    honest = honest_fake()

    def respond(req):  # 1_Double gets good code, 2_AddBias prose
        if "x * 2" in req.messages[0].content:
            return honest.complete(req)
        return Reply(text=PROSE, usage=Usage(90, 20), finish_reason="stop")

    summary = generate(config(problem_dir, tmp_path), client=FakeChatClient(respond))
    assert (summary.ok, summary.no_code, summary.request_failed) == (1, 1, 0)
    assert (summary.requests, summary.cache_hits, summary.prompt_tokens, summary.completion_tokens) == (2, 0, 190, 70)

    out = tmp_path / "out"
    good = (out / "level_1_problem_1_sample_0_kernel.py").read_text()
    assert "class ModelNew(nn.Module)" in good and "```" not in good
    bad = (out / "level_1_problem_2_sample_0_kernel.py").read_text()
    assert bad.splitlines()[0] == NO_CODE_MARKER and f"# {PROSE}" in bad and not has_code(bad)

    records = {r["problem"]: r for r in lines(summary.jsonl_path)}
    assert set(records) == {"L1/1_Double", "L1/2_AddBias"}
    ok, no_code = records["L1/1_Double"], records["L1/2_AddBias"]
    assert ok["status"] == "ok" and ok["code"] == good and ok["model"] == "m" and ok["sample"] == 0
    assert ok["usage"] == {"prompt_tokens": 100, "completion_tokens": 50} and ok["backend"] == "cuda"
    assert len(ok["prompt_hash"]) == 64 and ok["cached"] is False and ok["attempts"] == 1
    assert no_code["status"] == "no_code" and no_code["code"] == "" and no_code["error"] is None


def test_outputs_pair_with_problems(problem_dir, tmp_path):
    summary = generate(config(problem_dir, tmp_path, samples=2), client=honest_fake())
    problems = load_problems(str(problem_dir))
    for where in (summary.jsonl_path, summary.out_dir):  # the JSONL and the KernelBench layout both pair
        pairing = load_candidates(where, problems)
        assert not pairing.unpaired and len(pairing.pairs) == 4
        assert sorted(p.candidate.sample for p in pairing.pairs) == [0, 0, 1, 1]
        assert not any(p.candidate.no_code for p in pairing.pairs)


def test_failed_request_is_recorded_not_dropped(problem_dir, tmp_path):
    client = FakeChatClient(lambda req: ChatError("HTTP 503: overloaded", ErrorKind.TRANSIENT, 503))
    summary = generate(config(problem_dir, tmp_path), client=client)
    assert summary.request_failed == 2 and summary.requests == 6 and summary.retries == 4
    assert summary.errors == ("HTTP 503: overloaded",)
    for record in lines(summary.jsonl_path):
        assert record["status"] == "request_failed" and record["code"] == "" and "503" in record["error"]
        text = (summary.out_dir / record["file"]).read_text()
        assert text.splitlines()[0] == NO_CODE_MARKER and "overloaded" in text and not has_code(text)


def test_failures_are_not_cached(problem_dir, tmp_path):
    generate(config(problem_dir, tmp_path), client=FakeChatClient(lambda r: ChatError("x", ErrorKind.REJECTED, 400)))
    client = FakeChatClient(PROSE)
    summary = generate(config(problem_dir, tmp_path), client=client)
    assert len(client.calls) == 2 and summary.no_code == 2


def test_rerun_costs_no_request_and_does_not_duplicate(problem_dir, tmp_path):
    cfg = config(problem_dir, tmp_path, samples=3)
    first = honest_fake()
    generate(cfg, client=first)
    before = lines(tmp_path / "out" / "generations.jsonl")
    second = FakeChatClient(PROSE)
    summary = generate(cfg, client=second)
    assert second.calls == [] and summary.cache_hits == 6 and summary.requests == 0 and summary.ok == 6
    assert summary.prompt_tokens == 0  # cache hits cost nothing
    after = lines(summary.jsonl_path)
    assert len(after) == 6 and all(r["cached"] for r in after)
    assert [r["code"] for r in after] == [r["code"] for r in before]
    assert len({first.calls[i].messages for i in range(6)}) == 2  # one prompt per problem


def test_more_samples_only_asks_for_the_new_ones(problem_dir, tmp_path):
    generate(config(problem_dir, tmp_path, samples=2), client=FakeChatClient(PROSE))
    client = FakeChatClient(PROSE)
    summary = generate(config(problem_dir, tmp_path, samples=3), client=client)
    assert len(client.calls) == 2 and summary.cache_hits == 4
    assert sorted((r["problem"], r["sample"]) for r in lines(summary.jsonl_path)) == [
        ("L1/1_Double", 0), ("L1/1_Double", 1), ("L1/1_Double", 2),
        ("L1/2_AddBias", 0), ("L1/2_AddBias", 1), ("L1/2_AddBias", 2)]


def test_no_cache_neither_reads_nor_writes(problem_dir, tmp_path):
    cfg = config(problem_dir, tmp_path, use_cache=False)
    generate(cfg, client=FakeChatClient(PROSE))
    client = FakeChatClient(PROSE)
    generate(cfg, client=client)
    assert len(client.calls) == 2 and not (tmp_path / "cache").exists()


def test_sampling_change_misses_the_cache(problem_dir, tmp_path):
    generate(config(problem_dir, tmp_path), client=FakeChatClient(PROSE))
    client = FakeChatClient(PROSE)
    generate(config(problem_dir, tmp_path, sampling=SamplingParams(temperature=0.9)), client=client)
    assert len(client.calls) == 2 and client.calls[0].temperature == 0.9


def test_other_models_lines_are_kept(problem_dir, tmp_path):
    generate(config(problem_dir, tmp_path), client=FakeChatClient(PROSE))
    summary = generate(config(problem_dir, tmp_path, model="other"), client=FakeChatClient(PROSE))
    assert sorted({r["model"] for r in lines(summary.jsonl_path)}) == ["m", "other"]
    assert len(lines(summary.jsonl_path)) == 4


def test_fatal_refusal_stops_the_run(problem_dir, tmp_path):
    client = FakeChatClient(lambda r: ChatError("HTTP 401: invalid key", ErrorKind.FATAL, 401))
    with pytest.raises(UsageError, match="invalid key"):
        generate(config(problem_dir, tmp_path), client=client)


def test_progress_is_reported(problem_dir, tmp_path):
    seen: list[tuple[int, int]] = []
    generate(config(problem_dir, tmp_path, samples=2), client=FakeChatClient(PROSE),
             on_progress=lambda done, total: seen.append((done, total)))
    assert seen == [(0, 4), (1, 4), (2, 4), (3, 4), (4, 4)]


def test_prompts_carry_the_problem(problem_dir, tmp_path):
    client = FakeChatClient(PROSE)
    generate(config(problem_dir, tmp_path), client=client)
    prompts = sorted(c.messages[0].content for c in client.calls)
    assert any("x * 2" in p for p in prompts) and any("x + self.bias" in p for p in prompts)
    assert all(c.messages[0].role == "user" and len(c.messages) == 1 for c in client.calls)


def test_layout_file_names():
    problem = make_problem("19_ReLU", "Model=get_inputs=get_init_inputs=1\n", origin="t", level=1)
    assert layout_file_name(problem, 3) == "level_1_problem_19_sample_3_kernel.py"
    loose = make_problem("relu", "Model=get_inputs=get_init_inputs=1\n", origin="t")
    assert layout_file_name(loose, 0) == "relu__sample_0.py"


def test_clashing_layout_names(tmp_path):
    root = tmp_path / "problems" / "level1"
    root.mkdir(parents=True)
    (root / "1_A.py").write_text("Model=get_inputs=get_init_inputs=1\n")
    (root / "1_B.py").write_text("Model=get_inputs=get_init_inputs=1\n")
    with pytest.raises(UsageError, match="same level and id"):
        generate(config(root.parent, tmp_path), client=FakeChatClient(PROSE))


@pytest.mark.parametrize("changes, message", [
    ({"samples": 0}, "--samples"), ({"concurrency": 0}, "--concurrency"), ({"model": " "}, "--model"),
    ({"base_url": "localhost:8000"}, "--base-url"), ({"request_timeout_s": 0}, "--request-timeout"),
    ({"sampling": SamplingParams(max_tokens=0)}, "--max-tokens"),
])
def test_bad_options(problem_dir, tmp_path, changes, message):
    with pytest.raises(UsageError, match=message):
        check_config(config(problem_dir, tmp_path, **changes))


# --- the real SDK client, built by generate() --------------------------------------------------------

def test_missing_key_for_the_default_endpoint(problem_dir, tmp_path):
    cfg = config(problem_dir, tmp_path, base_url="https://api.openai.com/v1")
    with pytest.raises(UsageError, match=r"\$OPENAI_API_KEY is not set"):
        generate(cfg)


def test_missing_key_named_explicitly(problem_dir, tmp_path, chat_server):
    with pytest.raises(UsageError, match=r"\$MY_KEY is not set"):
        generate(config(problem_dir, tmp_path, base_url=chat_server.url, api_key_env="MY_KEY"))


def test_local_server_needs_no_key(problem_dir, tmp_path, chat_server):
    pytest.importorskip("openai")
    chat_server.on("m", PROSE)
    summary = generate(config(problem_dir, tmp_path, base_url=chat_server.url))
    assert summary.no_code == 2
    assert {h["authorization"] for h in chat_server.headers} == {"Bearer EMPTY"}


def test_fully_cached_run_needs_neither_key_nor_sdk(problem_dir, tmp_path, chat_server, monkeypatch):
    pytest.importorskip("openai")
    chat_server.on("m", PROSE)
    monkeypatch.setenv("MY_KEY", "sk-1")
    cfg = config(problem_dir, tmp_path, base_url=chat_server.url, api_key_env="MY_KEY")
    generate(cfg)
    monkeypatch.delenv("MY_KEY")
    monkeypatch.setitem(sys.modules, "openai", None)
    assert generate(cfg).cache_hits == 2


def test_missing_sdk(problem_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "openai", None)  # as if not installed
    with pytest.raises(UsageError, match=r"pip install 'kernelbench-verified\[generate\]'"):
        generate(config(problem_dir, tmp_path))


def test_concurrency_limit_through_the_server(problem_dir, tmp_path, chat_server):
    pytest.importorskip("openai")
    chat_server.on("m", Scripted(content=PROSE, delay_s=0.25))
    started = time.monotonic()
    summary = generate(config(problem_dir, tmp_path, base_url=chat_server.url, samples=4, concurrency=4))
    elapsed = time.monotonic() - started
    assert summary.no_code == 8 and chat_server.max_in_flight == 4
    assert elapsed < 8 * 0.25  # two waves of four, not eight in a row


def test_concurrency_one_is_sequential(problem_dir, tmp_path, chat_server):
    pytest.importorskip("openai")
    chat_server.on("m", Scripted(content=PROSE, delay_s=0.05))
    generate(config(problem_dir, tmp_path, base_url=chat_server.url, samples=2, concurrency=1))
    assert chat_server.max_in_flight == 1 and len(chat_server.requests) == 4


def test_mixed_outcomes_through_the_server(problem_dir, tmp_path, chat_server):
    """429 then success, a 500 that never heals, and a reply past the timeout, in one run."""
    pytest.importorskip("openai")

    def by_problem(body):
        prompt = body["messages"][-1]["content"]
        return Scripted(status=500, content="down") if "x + self.bias" in prompt else Scripted(content=PROSE)

    chat_server.on("m", Scripted(status=429, headers={"Retry-After": "0"}), by_problem)
    summary = generate(config(problem_dir, tmp_path, base_url=chat_server.url, concurrency=1))
    records = {r["problem"]: r for r in lines(summary.jsonl_path)}
    assert records["L1/1_Double"]["status"] == "no_code"
    assert records["L1/2_AddBias"]["status"] == "request_failed" and "500" in records["L1/2_AddBias"]["error"]
    assert summary.retries >= 3

    chat_server.on("slow", Scripted(content=PROSE, delay_s=1.0))
    cfg = config(problem_dir, tmp_path, base_url=chat_server.url, model="slow", request_timeout_s=0.2,
                 retry=RetryPolicy(max_retries=0))
    summary = generate(cfg)
    assert summary.request_failed == 2 and "timed out" in summary.errors[0]
