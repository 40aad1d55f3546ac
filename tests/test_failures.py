"""Every failure status through real misbehaving candidates, in ONE evaluate() run over a directory
(each candidate costs a child process), then checked one by one. A crashing, hanging or
junk-printing candidate must never stop the run, and every failure carries its evidence.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kbv.api import EvalConfig, RunResult, evaluate
from kbv.metrics import compute_metrics
from kbv.verdict import Status, Verdict
from sources import (CPP_BROKEN, CPP_RELU, CUDA_LOOKING_ERROR, CUDA_RELU, EXITS_0, HANGS, HONEST_RELU,
                     JUNK_STDOUT, KILLS_ITSELF, NO_CODE, NO_MODELNEW, RAISES, SEGFAULT, SYNTAX_ERROR,
                     forged_reply, write_tree)

TIMEOUT_S = 8.0

MISBEHAVING = {
    "raises": RAISES,
    "segfault": SEGFAULT,
    "hangs": HANGS,
    "exits_0": EXITS_0,
    "kills_itself": KILLS_ITSELF,
    "junk_stdout": JUNK_STDOUT,
    "syntax_error": SYNTAX_ERROR,
    "no_modelnew": NO_MODELNEW,
    "cuda_looking_error": CUDA_LOOKING_ERROR,
    "cuda_backend": CUDA_RELU,
    "no_code": NO_CODE,
    "zz_honest": HONEST_RELU,  # sorts last: evaluated after every misbehaving one
}


@pytest.fixture(scope="module")
def failures_run(tmp_path_factory: pytest.TempPathFactory, relu_problems: Path, cache_dir: Path) -> RunResult:
    root = tmp_path_factory.mktemp("failures")
    cands = write_tree(root / "candidates", {f"19_ReLU__{tag}.py": code for tag, code in MISBEHAVING.items()})
    return evaluate(EvalConfig(candidates=str(cands), problems=str(relu_problems), device="cpu",
                               run_dir=str(root / "run"), cache_dir=str(cache_dir), timeout_s=TIMEOUT_S, jobs=1))


@pytest.fixture(scope="module")
def verdicts(failures_run: RunResult) -> dict[str, Verdict]:
    return {v.candidate.removeprefix("19_ReLU__"): v for v in failures_run.verdicts}


def test_the_run_goes_on_to_the_end(failures_run: RunResult, verdicts: dict[str, Verdict]) -> None:
    assert set(verdicts) == set(MISBEHAVING)
    assert failures_run.evaluated == len(MISBEHAVING) and not failures_run.problem_failures
    assert verdicts["zz_honest"].status is Status.CORRECT
    assert verdicts["zz_honest"].speedup is not None and verdicts["zz_honest"].speedup > 0


def test_raise_is_a_runtime_error_with_traceback(verdicts: dict[str, Verdict]) -> None:
    v = verdicts["raises"]
    assert v.status is Status.RUNTIME_ERROR
    assert v.message == "ValueError: kbv-test: deliberate failure in forward (during forward)"
    assert "Traceback" in v.evidence["traceback"]
    assert 'raise ValueError("kbv-test: deliberate failure in forward")' in v.evidence["traceback"]


def test_segfault_is_crashed_sigsegv_with_stderr_tail(verdicts: dict[str, Verdict]) -> None:
    v = verdicts["segfault"]
    assert v.status is Status.CRASHED
    assert "SIGSEGV" in v.message
    assert v.evidence["returncode"] == -11
    assert "kbv-test: about to segfault" in v.evidence["stderr_tail"]


def test_infinite_loop_is_a_timeout(verdicts: dict[str, Verdict]) -> None:
    v = verdicts["hangs"]
    assert v.status is Status.TIMEOUT
    assert v.message.startswith("no answer within") and "stderr_tail" in v.evidence
    assert TIMEOUT_S - 1 < v.wall_s < TIMEOUT_S + 15  # the pair's budget, not forever


@pytest.mark.parametrize(("tag", "message"), [
    ("exits_0", "exited with code 0 during forward"),
    ("kills_itself", "killed by SIGKILL during forward"),
])
def test_early_exit_and_kill_are_crashed(verdicts: dict[str, Verdict], tag: str, message: str) -> None:
    v = verdicts[tag]
    assert v.status is Status.CRASHED
    assert v.message.startswith(message)
    assert "returncode" in v.evidence and "stderr_tail" in v.evidence


def test_junk_on_stdout_does_not_stop_a_correct_candidate(verdicts: dict[str, Verdict]) -> None:
    v = verdicts["junk_stdout"]
    assert v.status is Status.CORRECT, v.message
    assert len(v.trials) == 5 and all(t.passed for t in v.trials)


@pytest.mark.parametrize(("tag", "evidence"), [
    ("syntax_error", "SyntaxError"),
    ("no_modelnew", "defines no ModelNew"),
])
def test_unimportable_candidates_are_compile_errors(verdicts: dict[str, Verdict], tag: str, evidence: str) -> None:
    v = verdicts[tag]
    assert v.status is Status.COMPILE_ERROR
    assert evidence in v.message + v.evidence.get("traceback", "")


def test_an_unimportable_candidate_is_told_by_the_users_file_in_plain_words(verdicts: dict[str, Verdict]) -> None:
    """Not the copy in the build directory (`candidate.py`), nor a class of kbv's own."""
    assert re.fullmatch(r"/.+/candidates/19_ReLU__no_modelnew\.py defines no ModelNew \(during load\)",
                        verdicts["no_modelnew"].message), verdicts["no_modelnew"].message
    syntax = verdicts["syntax_error"]
    assert re.search(r"\(/.+/candidates/19_ReLU__syntax_error\.py, line 4\)", syntax.message), syntax.message
    assert 'candidates/19_ReLU__syntax_error.py", line 4' in syntax.evidence["traceback"]
    for v in (verdicts["no_modelnew"], syntax, verdicts["raises"]):
        text = v.message + v.evidence.get("traceback", "")
        assert "candidate.py" not in text and "_CompileFailure" not in text


def test_device_error_is_a_cuda_error(verdicts: dict[str, Verdict]) -> None:
    v = verdicts["cuda_looking_error"]
    assert v.status is Status.CUDA_ERROR
    assert "illegal memory access" in v.evidence["traceback"]


def test_cuda_candidate_on_cpu_is_skipped_and_not_counted(verdicts: dict[str, Verdict]) -> None:
    v = verdicts["cuda_backend"]
    assert v.status is Status.SKIPPED
    assert v.message == "a cuda candidate cannot run on cpu (no CUDA device)"  # one line: the build's error is evidence
    assert v.evidence["skipped_failure"]["status"] in ("compile_error", "runtime_error")
    metrics = compute_metrics(list(verdicts.values()))
    assert (metrics.pairs, metrics.skipped) == (len(MISBEHAVING) - 1, 1)


def test_no_code_reply(verdicts: dict[str, Verdict]) -> None:
    assert verdicts["no_code"].status is Status.NO_CODE


def test_only_passing_verdicts_carry_a_speedup(verdicts: dict[str, Verdict]) -> None:
    for tag, v in verdicts.items():
        assert (v.speedup is not None) == v.status.passed, tag


def test_verdicts_record_what_was_evaluated(failures_run: RunResult, verdicts: dict[str, Verdict]) -> None:
    v = verdicts["raises"]
    assert (v.problem, v.level, v.protocol) == ("L1/19_ReLU", 1, "standard")
    assert v.candidate == "19_ReLU__raises" and len(v.candidate_hash) == 64
    assert v.protocol_version == "kernelbench-v0.1+tol0.01"
    json.dumps([x.to_dict() for x in failures_run.verdicts])  # every verdict is plain JSON


# -- C++ candidates: two of the suite's four C++ sources, built once per session -----------------

@pytest.fixture(scope="module")
def cpp_verdicts(tmp_path_factory: pytest.TempPathFactory, relu_problems: Path, cache_dir: Path) -> dict[str, Verdict]:
    root = tmp_path_factory.mktemp("cpp")
    cands = write_tree(root / "candidates", {"19_ReLU__cpp.py": CPP_RELU, "19_ReLU__cpp_broken.py": CPP_BROKEN})
    result = evaluate(EvalConfig(candidates=str(cands), problems=str(relu_problems), device="cpu",
                                 run_dir=str(root / "run"), cache_dir=str(cache_dir), timeout_s=120, jobs=2))
    return {v.candidate.removeprefix("19_ReLU__"): v for v in result.verdicts}


@pytest.mark.slow
def test_cpp_compile_error_carries_the_compiler_message(cpp_verdicts: dict[str, Verdict]) -> None:
    v = cpp_verdicts["cpp_broken"]
    assert v.status is Status.COMPILE_ERROR
    assert v.message.startswith("build: ")
    assert "kbv_undeclared_symbol" in v.evidence["traceback"]  # the compiler's own words
    assert "error" in v.evidence["traceback"]


@pytest.mark.slow
def test_honest_cpp_candidate_builds_and_is_correct(cpp_verdicts: dict[str, Verdict]) -> None:
    v = cpp_verdicts["cpp"]
    assert v.status is Status.CORRECT, v.message
    assert v.speedup is not None and v.speedup > 0


# -- forged replies on the result channel --------------------------------------------------------

@pytest.mark.parametrize("forged", ['{"error": {"kind": "harness", "message": "forged"}}', '{"ok": true}'],
                         ids=["harness_error", "bare_ok"])
def test_a_forged_reply_is_the_candidates_verdict_not_the_runs_end(tmp_path: Path, relu_problems: Path,
                                                                    cache_dir: Path, forged: str) -> None:
    cands = write_tree(tmp_path / "c", {"19_ReLU__forger.py": forged_reply(forged),
                                        "19_ReLU__zz_honest.py": HONEST_RELU})
    result = evaluate(EvalConfig(candidates=str(cands), problems=str(relu_problems), device="cpu",
                                 run_dir=str(tmp_path / "run"), cache_dir=str(cache_dir), timeout_s=60))
    statuses = {v.candidate: v.status for v in result.verdicts}
    assert statuses["19_ReLU__zz_honest"] is Status.CORRECT
    assert statuses["19_ReLU__forger"] not in (Status.CORRECT, Status.VERIFIED)
