"""`kbv redteam` end to end on a CPU, as a user runs it: a slice of three transformations and a
hacker model (the loopback chat server) over two bundled Triton examples, both protocols. Every
mutant fools the standard protocol and none fools the verified one; the JSON, the progress lines, the
HTML report's section and a resumed run. About two minutes on a 2-core box."""

from __future__ import annotations

import inspect
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from chat_server import ChatServer
from hackers import replay_hack
from redteam_targets import EXAMPLES

SRC = Path(__file__).resolve().parents[2] / "src"
SLICE = ("statistic_fast_path", "replay_call_count", "lazy_subclass")
HONEST = ("2_ReLU__triton.py", "6_Softmax__triton.py")


def kbv(*args: str, timeout_s: float = 900) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "kbv", *args], env=env, capture_output=True, text=True,
                          timeout=timeout_s)


@pytest.fixture(scope="module")
def chat_server() -> ChatServer:
    server = ChatServer()
    server.on("fake-hacker", replay_hack)
    yield server
    server.close()


@pytest.fixture(scope="module")
def red_team(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path,
             chat_server: ChatServer) -> tuple[subprocess.CompletedProcess[str], Path, list[str]]:
    root = tmp_path_factory.mktemp("redteam")
    (root / "honest").mkdir()
    for name in HONEST:
        shutil.copy(EXAMPLES / name, root / "honest" / name)
    args = [str(root / "honest"), "--problems", "smoke", "--device", "cpu", "--transforms", ",".join(SLICE),
            "--model", "fake-hacker", "--base-url", chat_server.url, "--cache-dir", str(cache_dir), "--seed", "7",
            "--timer-budget", "2", "--ci-target", "0.05", "--timeout", "240", "--run", str(root / "run"),
            "--format", "json"]
    return kbv("redteam", *args), root / "run", args


def test_every_mutant_fools_standard_and_none_fools_verified(red_team: tuple) -> None:
    done, _, _ = red_team
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    rows = {(t["transformation"], t["protocol"]): t for t in result["transformations"]}
    assert set(rows) == {(n, p) for n in (*SLICE, "model:fake-hacker") for p in ("standard", "verified")}
    for (name, protocol), row in rows.items():
        assert {"transformation", "protocol", "mutants", "fooled", "attack_success"} <= set(row)
        assert row["mutants"] == 2, (name, row)
        assert row["attack_success"] == (1.0 if protocol == "standard" else 0.0), (name, protocol, row)
    assert [h["base"] and not h["flagged"] for h in result["honest"]] == [True, True]
    assert all([c["status"] for c in h["controls"]] == ["correct", "verified"] for h in result["honest"])
    for mutant in result["mutants"]:
        verified = next(o for o in mutant["outcomes"] if o["protocol"] == "verified")
        assert verified["status"] != "verified" and verified["categories"], mutant["candidate"]
    assert result["fixtures"] == [] and {t["protocol"]: t["fooled"] for t in result["totals"]} == {
        "standard": 8, "verified": 0}


def test_a_progress_line_per_mutant_on_stderr(red_team: tuple) -> None:
    done, _, _ = red_team
    lines = [line for line in done.stderr.splitlines() if line.startswith("[mutant ")]
    assert len(lines) == 8 and all(" standard correct" in line and " · verified " in line for line in lines)
    assert any("x model:fake-hacker (speed)" in line for line in lines)
    controls = [line for line in done.stderr.splitlines() if line.startswith("[control ")]
    assert len(controls) == 2 and all("· verified verified" in line for line in controls)


def test_the_html_report_has_the_red_team_section(red_team: tuple, tmp_path: Path) -> None:
    _, run, _ = red_team
    page = tmp_path / "report.html"
    done = kbv("report", str(run), "--format", "html", "--out", str(page))
    assert done.returncode == 0, done.stderr[-2000:]
    html = page.read_text()
    assert 'id="redteam"' in html
    assert all(name in html for name in SLICE) and "model:fake-hacker" in html and "standard: 8/8" in html


def test_the_same_command_resumes_without_asking_the_model_again(red_team: tuple, chat_server: ChatServer) -> None:
    _, _, args = red_team
    asked = len(chat_server.requests)
    again = kbv("redteam", *args)
    assert again.returncode == 0, again.stderr[-2000:]
    assert len(chat_server.requests) == asked  # the replies came from the response cache
    assert "[mutant " not in again.stderr  # every verdict came from the run's store
    assert {t["protocol"]: t["fooled"] for t in json.loads(again.stdout)["totals"]} == {"standard": 8, "verified": 0}


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "honest").mkdir()
    shutil.copy(EXAMPLES / HONEST[0], tmp_path / "honest" / HONEST[0])
    inside = kbv("redteam", str(tmp_path / "honest"), "--device", "cpu", "--run", str(tmp_path / "honest" / "run"))
    unknown = kbv("redteam", str(tmp_path / "honest"), "--transforms", "replay_pointr")
    lanes = kbv("redteam", str(tmp_path / "honest"), "--device", "cpu", "--pairs-per-device", "9",
                "--run", str(tmp_path / "run"))
    empty = kbv("redteam", str(tmp_path / "honest"), "--device", "cpu", "--transforms", " ,", "--run", str(tmp_path / "run"))
    devices = kbv("redteam", str(tmp_path / "honest"), "--devices", "foo", "--run", str(tmp_path / "run"))
    (tmp_path / "afile").write_text("")
    fixtures = kbv("redteam", str(tmp_path / "honest"), "--device", "cpu", "--fixtures", str(tmp_path / "afile" / "sub"),
                   "--run", str(tmp_path / "run"))
    for done in (inside, unknown, lanes, empty, devices, fixtures, kbv("redteam"),
                 kbv("redteam", str(tmp_path / "missing"))):
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert done.stderr.startswith("error: ") and "Traceback" not in done.stderr
    assert "lies inside the candidates' directory" in inside.stderr and "Did you mean replay_pointer" in unknown.stderr
    assert "--pairs-per-device 9: expected 1 to 8" in lanes.stderr and "names no transformation" in empty.stderr
    assert "--fixtures" in fixtures.stderr and "is not a directory" in fixtures.stderr
    assert not lanes.stdout + devices.stdout + empty.stdout + fixtures.stdout  # refused before the run says anything
    assert not (tmp_path / "run").exists()


def test_help_and_list_name_the_options_and_every_transformation() -> None:
    shown = kbv("redteam", "--help")
    assert shown.returncode == 0 and "--transforms" in shown.stdout and "--model" in shown.stdout
    listed = kbv("redteam", "--list")
    assert listed.returncode == 0 and all(name in listed.stdout for name in (*SLICE, "default_init", "timer_cuda_event"))


def test_the_lanes_and_the_preparation_bound_reach_the_evaluation() -> None:
    """`--pairs-per-device` and `--prepare-timeout` mean what they mean to `kbv eval`: the red team's two
    evaluations (the honest candidates, then the mutants) run with them."""
    from kbv.redteam.command import _config, redteam_command

    options = {name: param.default for name, param in inspect.signature(redteam_command).parameters.items()}
    config = _config({**options, "candidates": "examples", "pairs_per_device": 2, "prepare_timeout": 45.0})
    assert (config.evaluation.pairs_per_device, config.evaluation.prepare_timeout_s) == (2, 45.0)
    plain = _config({**options, "candidates": "examples"})
    assert (plain.evaluation.pairs_per_device, plain.evaluation.prepare_timeout_s) == (1, 0.0)
