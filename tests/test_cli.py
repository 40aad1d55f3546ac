"""The `kbv` command end to end: eval, report (table, json, jsonl), problems list; exit codes, and
one-line errors without a traceback for bad input."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner, Result

from kbv.cli import app
from kbv.store import DB_NAME, Store
from sources import (CPP_RELU, GET_INPUTS_RAISES_PROBLEM, HONEST_RELU, LINEAR_PROBLEM, RELU_PROBLEM,
                     SYNTAX_ERROR_PROBLEM, WRONG_RELU, write_tree)

SRC = Path(__file__).resolve().parents[1] / "src"
VERDICT_KEYS = {"problem", "candidate", "protocol", "status", "categories", "speedup"}


def kbv(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m kbv ARGS` in a fresh process, as a user runs it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "kbv", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def invoke(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def _squash(text: str) -> str:
    """Without white space: rich wraps long lines (paths included) at the console's width."""
    return "".join(text.split())


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory, relu_problems: Path) -> Path:
    root = tmp_path_factory.mktemp("cli")
    # The honest candidate is the suite's C++ ReLU: the verified protocol passes only custom kernels.
    write_tree(root / "candidates", {"19_ReLU__honest.py": CPP_RELU, "19_ReLU__wrong.py": WRONG_RELU,
                                     "99_Nothing.py": HONEST_RELU})
    return root


@pytest.fixture(scope="module")
def evaluated(workspace: Path, relu_problems: Path, cache_dir: Path) -> subprocess.CompletedProcess[str]:
    """Both protocols over honest + wrong (+ one unpaired file), by the real command. Builds the C++
    ReLU unless an earlier test of the session did."""
    return kbv("eval", str(workspace / "candidates"), "--problems", str(relu_problems), "--device", "cpu",
               "--run", str(workspace / "run"), "--cache-dir", str(cache_dir), "--protocol", "both",
               "--seed", "7", "--timeout", "120", "--timer-budget", "2", "--jobs", "1")


@pytest.fixture(scope="module")
def report_json(evaluated: subprocess.CompletedProcess[str], workspace: Path) -> dict:
    result = invoke("report", str(workspace / "run"), "--format", "json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


# -- eval and report -----------------------------------------------------------------------------

@pytest.mark.slow
def test_eval_exits_0_whatever_the_verdicts_and_prints_the_tables(evaluated: subprocess.CompletedProcess[str]) -> None:
    assert evaluated.returncode == 0, evaluated.stderr
    out = evaluated.stdout
    for text in ("Verdicts", "L1/19_ReLU", "19_ReLU__honest", "19_ReLU__wrong", "standard", "verified",
                 "correct", "incorrect", "Metrics", "fast_1", "geomean"):
        assert text in out, text
    assert "evaluated 4, resumed 0, unpaired 1" in out
    assert f"unpaired: {evaluated.args[4]}/99_Nothing.py: no problem named '99_Nothing'." in out.splitlines()
    assert "Traceback" not in evaluated.stderr


@pytest.mark.slow
def test_report_json_has_verdicts_and_metrics(report_json: dict) -> None:
    verdicts = report_json["verdicts"]
    assert all(VERDICT_KEYS <= set(v) for v in verdicts)
    statuses = {(v["candidate"], v["protocol"]): v["status"] for v in verdicts}
    assert statuses == {("19_ReLU__honest", "standard"): "correct", ("19_ReLU__honest", "verified"): "verified",
                        ("19_ReLU__wrong", "standard"): "incorrect", ("19_ReLU__wrong", "verified"): "incorrect"}
    for v in verdicts:
        assert (v["speedup"] is not None) == (v["status"] in ("correct", "verified"))
        flagged = [c for c in v["categories"] if c != "unstable_timing"]  # a note on the figure, not a failure
        assert (flagged == []) == (v["status"] in ("correct", "verified"))
    for protocol in ("standard", "verified"):
        m = report_json["metrics"][protocol]["all"]
        assert (m["pairs"], m["compile_rate"], m["correct_rate"]) == (2, 1.0, 0.5)
        assert set(m["fast_p"]) == {"fast_0", "fast_0.5", "fast_0.8", "fast_1", "fast_1.5", "fast_2"}
        assert report_json["metrics"][protocol]["L1"]["pairs"] == 2
    assert {v["provenance"].get("verified_seed") for v in verdicts if v["protocol"] == "verified"} == {7}


@pytest.mark.slow
def test_report_jsonl_is_one_verdict_a_line(report_json: dict, workspace: Path) -> None:
    result = invoke("report", str(workspace / "run"), "--format", "jsonl")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert [json.loads(line) for line in lines] == report_json["verdicts"]


@pytest.mark.slow
def test_report_table(evaluated: subprocess.CompletedProcess[str], workspace: Path) -> None:
    result = invoke("report", str(workspace / "run"))
    assert result.exit_code == 0
    assert "19_ReLU__wrong" in result.stdout and "value_mismatch" in result.stdout and "Metrics" in result.stdout


@pytest.mark.slow
def test_eval_again_resumes_everything(evaluated: subprocess.CompletedProcess[str], workspace: Path,
                                       relu_problems: Path, cache_dir: Path) -> None:
    result = invoke("eval", str(workspace / "candidates"), "--problems", str(relu_problems), "--device", "cpu",
                    "--run", str(workspace / "run"), "--cache-dir", str(cache_dir), "--protocol", "both",
                    "--seed", "7", "--timer-budget", "2")
    assert result.exit_code == 0, result.stderr
    assert "evaluated 0, resumed 4, unpaired 1" in result.stdout


@pytest.mark.slow
def test_eval_json_output(evaluated: subprocess.CompletedProcess[str], workspace: Path, relu_problems: Path,
                          cache_dir: Path) -> None:
    result = invoke("eval", str(workspace / "candidates"), "--problems", str(relu_problems), "--device", "cpu",
                    "--run", str(workspace / "run"), "--cache-dir", str(cache_dir), "--protocol", "standard",
                    "--format", "json")
    assert result.exit_code == 0, result.stderr
    payload = json.loads(result.stdout)
    assert {v["status"] for v in payload["verdicts"]} == {"correct", "incorrect"}
    assert payload["metrics"]["standard"]["all"]["correct_rate"] == 0.5


def test_a_failing_problem_exits_1_naming_the_file(tmp_path: Path, cache_dir: Path) -> None:
    problems = write_tree(tmp_path / "p", {"level1/8_NoInputs.py": GET_INPUTS_RAISES_PROBLEM})
    cands = write_tree(tmp_path / "c", {"8_NoInputs.py": HONEST_RELU})
    result = invoke("eval", str(cands), "--problems", str(problems), "--device", "cpu", "--run", str(tmp_path / "run"),
                    "--cache-dir", str(cache_dir))
    assert result.exit_code == 1
    assert "problemfailed:" in _squash(result.stderr) and "8_NoInputs.py" in _squash(result.stderr)
    assert "cannotdrawitsinputs" in _squash(result.stderr)


def test_unpaired_candidates_are_listed_before_the_run_with_their_reasons(tmp_path: Path, relu_problems: Path,
                                                                          cache_dir: Path) -> None:
    """Each unpaired candidate and why, where the run's progress goes (stdout for the table, stderr
    for json), the first 20 and a count of the rest; json keeps them all under `unpaired`."""
    nothing = {f"42_Nothing{i:02d}__x.py": HONEST_RELU for i in range(21)}
    cands = write_tree(tmp_path / "c", {"19_ReLU__ok.py": HONEST_RELU, "19_ReLUU__typo.py": HONEST_RELU, **nothing})
    args = ("eval", str(cands), "--problems", str(relu_problems), "--device", "cpu", "--run", str(tmp_path / "run"),
            "--cache-dir", str(cache_dir))
    result = invoke(*args)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    listed = [line for line in lines if line.startswith("unpaired: ")]
    assert listed[0] == f"unpaired: {cands}/19_ReLUU__typo.py: no problem named '19_ReLUU'. Did you mean 19_ReLU?"
    assert listed[1:] == [f"unpaired: {cands}/42_Nothing{i:02d}__x.py: no problem named '42_Nothing{i:02d}'."
                          for i in range(19)] + ["unpaired: ... and 2 more"]
    assert lines.index(listed[-1]) < next(i for i, line in enumerate(lines) if line.startswith("[1/1]"))  # before the run
    assert "unpaired 22)" in result.stdout
    resumed = invoke(*args, "--format", "json")  # the pair is stored: nothing runs again
    assert resumed.exit_code == 0, resumed.stderr
    assert [line for line in resumed.stderr.splitlines() if line.startswith("unpaired: ")] == listed
    payload = json.loads(resumed.stdout)
    assert len(payload["unpaired"]) == 22 and payload["unpaired"][0] == {
        "candidate": "19_ReLUU__typo", "origin": f"{cands}/19_ReLUU__typo.py", "problem_ref": "19_ReLUU__typo",
        "reason": "no problem named '19_ReLUU'. Did you mean 19_ReLU?"}
    assert [v["candidate"] for v in payload["verdicts"]] == ["19_ReLU__ok"]


def test_a_run_where_nothing_pairs_exits_2_with_the_first_reasons(tmp_path: Path, relu_problems: Path) -> None:
    cands = write_tree(tmp_path / "c", {f"4{i}_Nothing.py": HONEST_RELU for i in range(5)})
    result = invoke("eval", str(cands), "--problems", str(relu_problems), "--device", "cpu", "--run", str(tmp_path / "run"))
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
    assert result.stderr.splitlines() == [
        f"error: No candidate pairs with a problem of '{relu_problems}' (5 unpaired): "
        f"{cands}/40_Nothing.py: no problem named '40_Nothing'; {cands}/41_Nothing.py: no problem named "
        f"'41_Nothing'; {cands}/42_Nothing.py: no problem named '42_Nothing'; ... and 2 more"]
    assert not (tmp_path / "run").exists()


# -- problems list -------------------------------------------------------------------------------

def test_problems_list_of_a_kernelbench_repository(tmp_path: Path) -> None:
    """KernelBench's repository: its level folders' problems, and none of the Python beside them."""
    root = write_tree(tmp_path / "kb", {"KernelBench/level1/19_ReLU.py": RELU_PROBLEM,
                                        "KernelBench/level2/3_Linear.py": LINEAR_PROBLEM,
                                        "src/kernelbench/analysis.py": "def f():\n    return 1\n",
                                        "src/kernelbench/prompts/model_ex_0.py": RELU_PROBLEM,
                                        "scripts/run.py": "import sys\n"})
    for spec in (root, root / "KernelBench"):
        result = invoke("problems", "list", str(spec))
        assert result.exit_code == 0, result.stderr
        assert "2 problems in" in result.stdout and "L1/19_ReLU" in result.stdout and "L2/3_Linear" in result.stdout
        assert "model_ex_0" not in result.stdout



def test_problems_list_suite_and_directory(relu_problems: Path) -> None:
    result = invoke("problems", "list", "smoke")
    assert result.exit_code == 0
    assert "16 problems in smoke" in result.stdout
    assert all(key in result.stdout for key in ("L1/2_ReLU", "L1/6_Softmax", "L1/11_MSELoss", "L3/"))
    result = invoke("problems", "list", str(relu_problems))
    assert result.exit_code == 0 and "1 problems" in result.stdout and "L1/19_ReLU" in result.stdout


# -- bad input: exit 2, one line, no traceback ---------------------------------------------------

def test_bad_path_exits_2_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    done = kbv("eval", "missing", "--problems", "smoke", "--device", "cpu", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.splitlines() == ["error: No candidates at 'missing': no such file or directory."]
    assert "Traceback" not in done.stdout + done.stderr


def test_a_long_bad_path_is_still_one_line(tmp_path: Path) -> None:
    missing = tmp_path / ("a_rather_long_directory_name_" * 3) / "candidates"
    done = kbv("eval", str(missing), "--problems", "smoke", "--device", "cpu")
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1, done.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["eval", "{cands}", "--protocol", "fast"], "Unknown protocol 'fast': expected standard, verified or both."),
    (["eval", "{cands}", "--format", "jsonl"], "Unknown format 'jsonl': expected table, json."),
    (["eval", "{cands}", "--problems", "smok"], "Did you mean smoke?"),
    (["eval", "{cands}", "--device", "tpu"], "Unknown device 'tpu'"),
    (["eval", "{cands}", "--timeout", "0"], "--timeout 0: expected a positive number of seconds."),
    (["eval", "{cands}", "--jobs", "-1"], "--jobs -1: expected 0"),
    (["eval", "{cands}", "--tolerance", "2"], "--tolerance 2: expected a number between 0 and 1"),
    # every protocol's numbers, under standard too, before the sandbox line or anything else
    (["eval", "{cands}", "--timer-budget", "-1"], "--timer-budget -1: expected a positive number of seconds."),
    (["eval", "{cands}", "--protocol", "verified", "--timer-budget", "0"], "--timer-budget 0: expected a positive"),
    (["eval", "{cands}", "--timeout", "nan"], "--timeout nan: expected a positive number of seconds."),
    (["eval", "{cands}", "--build-timeout", "inf"], "--build-timeout inf: expected a positive number"),
    (["eval", "{cands}", "--trials", "0"], "--trials 0: expected 1 or more."),
    (["eval", "{cands}", "--ci-target", "1"], "--ci-target 1: expected a number between 0 and 1."),
    (["eval", "{cands}", "--min-custom-share", "1.5"], "--min-custom-share 1.5: expected a share from 0 to 1."),
    (["eval", "{cands}", "--pairs-per-device", "0"], "--pairs-per-device 0: expected 1 to 8."),
    (["eval", "{cands}", "--seed", str(1 << 130)], f"--seed {1 << 130}: expected a 128-bit integer."),
    (["eval", "{cands}", "--precision", "bf16"], "Unknown precision 'bf16': expected tf32 or fp32."),
    (["eval", "{cands}", "--standard-timing", "cuda_events"],
     "Unknown standard timing 'cuda_events': expected cuda_event, do_bench or host_time. Did you mean cuda_event?"),
    (["eval", "{cands}", "--standard-timing", "nsight_python"], "--standard-timing nsight_python needs"),
    (["eval", "{cands}", "--problems", "{bad_problems}"], "7_Bad.py: syntax error at line 3"),
    (["report", "{tmp}", "--format", "xml"], "Unknown format 'xml': expected table, json, jsonl, html, csv, parquet."),
    (["report", "{tmp}"], "No kbv run at"),
    (["problems", "list", "no/such/dir"], "No problems at 'no/such/dir'"),
], ids=["protocol", "eval-format", "suite", "device", "timeout", "jobs", "tolerance", "timer-budget",
        "timer-budget-verified", "timeout-nan", "build-timeout-inf", "trials", "ci-target", "min-custom-share",
        "pairs-per-device", "seed", "precision", "standard-timing",
        "nsight", "bad-problem", "report-format", "no-run", "problems-list"])
def test_bad_input_exits_2_with_the_reason(tmp_path: Path, args: list[str], message: str) -> None:
    cands = write_tree(tmp_path / "c", {"2_ReLU.py": HONEST_RELU})  # pairs with the smoke suite
    bad = write_tree(tmp_path / "p", {"level1/7_Bad.py": SYNTAX_ERROR_PROBLEM})
    argv = [a.format(cands=cands, bad_problems=bad, tmp=tmp_path) for a in args]
    if argv[0] == "eval":
        argv += ["--run", str(tmp_path / "run")] + (["--device", "cpu"] if "--device" not in argv else [])
    result = invoke(*argv)
    assert result.exit_code == 2, result.stdout + result.stderr
    assert isinstance(result.exception, SystemExit)  # not an uncaught exception
    assert result.stderr.startswith("error:") and _squash(message) in _squash(result.stderr)
    assert len(result.stderr.splitlines()) == 1 and not result.stdout  # nothing printed before or beside it
    assert not (tmp_path / "run").exists()  # nothing was started


@pytest.mark.parametrize("where", ["afile", "afile/run", "cache:afile"])
def test_a_file_in_the_way_of_the_run_or_the_cache_is_refused_before_anything_prints(tmp_path: Path,
                                                                                      where: str) -> None:
    """Not even the unpaired candidates' lines come first: the run directory is checked with the other
    options."""
    cands = write_tree(tmp_path / "c", {"2_ReLU.py": HONEST_RELU, "19_ReLUU__typo.py": HONEST_RELU})
    (tmp_path / "afile").write_text("not a directory\n")
    option, name = ("--cache-dir", where.split(":")[1]) if where.startswith("cache:") else ("--run", where)
    extra = ["--run", str(tmp_path / "run")] if option == "--cache-dir" else []
    result = invoke("eval", str(cands), "--device", "cpu", option, str(tmp_path / name), *extra)
    assert result.exit_code == 2 and not result.stdout, result.stdout + result.stderr
    assert result.stderr.startswith(f"error: {option} {tmp_path / name}: ") and len(result.stderr.splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_a_bad_standard_timing_is_one_line_and_exit_2(tmp_path: Path) -> None:
    cands = write_tree(tmp_path / "c", {"2_ReLU.py": HONEST_RELU})
    done = kbv("eval", str(cands), "--device", "cpu", "--standard-timing", "do-bench", "--run", str(tmp_path / "run"))
    assert done.returncode == 2 and "Traceback" not in done.stdout + done.stderr
    assert done.stderr.splitlines() == ["error: Unknown standard timing 'do-bench': expected cuda_event, do_bench "
                                        "or host_time. Did you mean do_bench?"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_cuda_device_without_a_gpu_exits_2(tmp_path: Path) -> None:
    cands = write_tree(tmp_path / "c", {"2_ReLU.py": HONEST_RELU})  # pairs with the smoke suite
    result = invoke("eval", str(cands), "--device", "cuda", "--run", str(tmp_path / "run"))
    assert result.exit_code == 2 and "noCUDAdeviceisavailable" in _squash(result.stderr)


def test_report_of_another_schema_exits_2(tmp_path: Path) -> None:
    Store(tmp_path / DB_NAME).close()
    with sqlite3.connect(tmp_path / DB_NAME) as db:
        db.execute("UPDATE meta SET value='999' WHERE key='schema_version'")
    db.close()
    result = invoke("report", str(tmp_path))
    assert result.exit_code == 2 and "writtenbyschema999" in _squash(result.stderr)


@pytest.mark.parametrize("option", ["--run", "--cache-dir"])
def test_a_run_or_cache_dir_that_is_a_file_exits_2(tmp_path: Path, option: str) -> None:
    cands = write_tree(tmp_path / "c", {"2_ReLU.py": HONEST_RELU})
    a_file = tmp_path / "a_file"
    a_file.write_text("not a directory")
    dirs = {"--run": str(tmp_path / "run"), "--cache-dir": str(tmp_path / "cache"), option: str(a_file)}
    result = invoke("eval", str(cands), "--device", "cpu", *[x for kv in dirs.items() for x in kv])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
    assert result.stderr.startswith("error:") and "a_file" in _squash(result.stderr)


def test_off_a_terminal_a_run_without_a_verdict_for_30_s_prints_one_line_what_it_waits_on(capsys) -> None:
    from kbv.cli import WAIT_LINE_S, _progress
    from kbv.executors import RunState

    state = RunState(builds_running=14, builds_queued=3, oldest_build="1_Matmul__x", oldest_build_s=95.0,
                     evaluating=("cuda:0: L1/2_ReLU/2_ReLU__y verified timing 12 s",),
                     next_pair="L1/3_GELU/3_GELU__z standard", next_waits_for="its build (running 40 s)")
    with _progress("table") as (progress, watch):
        for since in (1.0, WAIT_LINE_S - 1, WAIT_LINE_S + 0.5, WAIT_LINE_S + 10, 2 * WAIT_LINE_S + 1):
            watch(state, since)
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"[no verdict for {WAIT_LINE_S + 0.5:.0f} s] {state.describe()}",
                     f"[no verdict for {2 * WAIT_LINE_S + 1:.0f} s] {state.describe()}"]  # again every 30 s
    assert state.describe() == ("builds: 14 running (oldest 1_Matmul__x, 95 s), 3 queued; "
                                "cuda:0: L1/2_ReLU/2_ReLU__y verified timing 12 s; "
                                "next: L1/3_GELU/3_GELU__z standard, waiting for its build (running 40 s)")
