"""`kbv generate` through a throwaway typer app, against the loopback server."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from chat_server import Scripted
from typer.testing import CliRunner

from kbv.generate.api import read_jsonl
from kbv.generate.command import generate_command

pytest.importorskip("openai")

PROSE = "No code today."


def make_app() -> typer.Typer:
    app = typer.Typer()
    app.command("generate")(generate_command)

    @app.command("version")
    def version() -> None:  # a second command, so `generate` stays a subcommand as in the real CLI
        pass

    return app


def run(*args: str):
    return CliRunner().invoke(make_app(), ["generate", *args], env={"COLUMNS": "250"})


def base_args(problem_dir: Path, tmp_path: Path, url: str, *extra: str) -> list[str]:
    return ["--problems", str(problem_dir), "--model", "m", "--base-url", url, "--out", str(tmp_path / "out"),
            "--cache-dir", str(tmp_path / "cache"), *extra]


def test_generate_then_rerun_from_cache(problem_dir, tmp_path, chat_server, honest):
    chat_server.on("m", honest)
    args = base_args(problem_dir, tmp_path, chat_server.url, "--samples", "2", "--temperature", "0.7",
                     "--max-tokens", "2048", "--extra-body", '{"reasoning_effort": "high"}', "--concurrency", "3")
    result = run(*args)
    assert result.exit_code == 0, result.output
    assert "generations.jsonl" in result.output and "4 (2 problems)" in result.output
    assert len(chat_server.requests) == 4
    body = chat_server.requests[0]
    assert body["temperature"] == 0.7 and body["max_tokens"] == 2048 and body["reasoning_effort"] == "high"
    assert "load_inline" in body["messages"][0]["content"]  # the CUDA template by default

    records = read_jsonl(tmp_path / "out" / "generations.jsonl")
    assert len(records) == 4 and {r["status"] for r in records} == {"ok"}
    assert sorted(p.name for p in (tmp_path / "out").glob("*.py")) == [
        "level_1_problem_1_sample_0_kernel.py", "level_1_problem_1_sample_1_kernel.py",
        "level_1_problem_2_sample_0_kernel.py", "level_1_problem_2_sample_1_kernel.py"]

    again = run(*args)
    assert again.exit_code == 0, again.output
    assert len(chat_server.requests) == 4  # nothing sent
    assert len(read_jsonl(tmp_path / "out" / "generations.jsonl")) == 4


def test_triton_backend_and_custom_template(problem_dir, tmp_path, chat_server):
    chat_server.on("m", PROSE)
    assert run(*base_args(problem_dir, tmp_path, chat_server.url, "--backend", "triton")).exit_code == 0
    assert "@triton.jit" in chat_server.requests[0]["messages"][0]["content"]

    template = tmp_path / "mine.md"
    template.write_text("Speed up $problem_name:\n$problem_source")
    result = run(*base_args(problem_dir, tmp_path, chat_server.url, "--prompt-template", str(template), "--no-cache"))
    assert result.exit_code == 0, result.output
    assert chat_server.requests[-1]["messages"][0]["content"].startswith("Speed up ")


def test_no_code_is_a_result_not_an_error(problem_dir, tmp_path, chat_server):
    chat_server.on("m", PROSE)
    result = run(*base_args(problem_dir, tmp_path, chat_server.url))
    assert result.exit_code == 0, result.output
    assert {r["status"] for r in read_jsonl(tmp_path / "out" / "generations.jsonl")} == {"no_code"}


def test_every_request_failing_exits_1(problem_dir, tmp_path, chat_server):
    chat_server.on("m", Scripted(status=500, content="down"))
    result = run(*base_args(problem_dir, tmp_path, chat_server.url, "--max-retries", "0"))
    assert result.exit_code == 1
    assert "No request got a reply" in result.output and "HTTP 500" in result.output
    assert len(read_jsonl(tmp_path / "out" / "generations.jsonl")) == 2  # recorded all the same


def test_timeout_option(problem_dir, tmp_path, chat_server):
    chat_server.on("m", Scripted(content=PROSE, delay_s=1.0))
    result = run(*base_args(problem_dir, tmp_path, chat_server.url, "--request-timeout", "0.2", "--max-retries", "0"))
    assert result.exit_code == 1 and "timed out after 0.2 s" in result.output


@pytest.mark.parametrize("extra, message", [
    (["--extra-body", "{oops"], "--extra-body is not valid JSON"),
    (["--extra-body", "[1]"], "--extra-body must be a JSON object"),
    (["--api-key-env", "NOT_SET_ANYWHERE"], "$NOT_SET_ANYWHERE is not set"),
])
def test_usage_errors_are_one_line(problem_dir, tmp_path, chat_server, extra, message):
    result = run(*base_args(problem_dir, tmp_path, chat_server.url, *extra))
    assert result.exit_code == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in result.output


def test_unknown_model_stops_the_run(problem_dir, tmp_path, chat_server):
    result = run(*base_args(problem_dir, tmp_path, chat_server.url))
    assert result.exit_code == 2 and "HTTP 404" in result.stderr and "--model" in result.stderr


def test_unknown_suite(tmp_path, chat_server):
    result = run("--problems", "smoak", "--model", "m", "--base-url", chat_server.url, "--out", str(tmp_path))
    assert result.exit_code == 2 and "Did you mean smoke" in result.stderr
