"""bench/kernelbench_sweep.py on a CPU: each problem's own Model as its candidate, under both protocols,
on a KernelBench-shaped tree; a small problem is judged (standard correct, verified no_custom_kernel
with its time against the baseline), one too large for the machine is refused with its figures; the
JSON keeps both, and a resumed sweep keeps them without evaluating anything. In chunks, no chunk tries an
earlier one's problems again, the JSON holds every chunk's rows, and past --budget no further chunk starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from sources import RELU_PROBLEM, write_tree

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "kernelbench_sweep.py"


def _sweep(*args: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, str(SCRIPT), *args], env={**os.environ, "PYTHONPATH": path},
                          capture_output=True, text=True, timeout=900)


def test_a_small_problem_is_judged_and_a_huge_one_refused_and_a_resumed_sweep_keeps_both(tmp_path: Path) -> None:
    huge = RELU_PROBLEM.replace("torch.randn(16, 256)", "torch.randn(1 << 20, 1 << 16)")  # 256 GiB
    tree = write_tree(tmp_path / "KernelBench", {"level1/19_ReLU.py": RELU_PROBLEM, "level1/20_Huge.py": huge,
                                                  "level2/1_Other.py": RELU_PROBLEM})
    out, page = tmp_path / "sweep.json", tmp_path / "sweep.md"
    args = [str(tree), "--device", "cpu", "--only", "L1/19,L1/20", "--work", str(tmp_path / "work"),
            "--timer-budget", "0.5", "--seed", "3", "--out", str(out), "--markdown", str(page)]
    first = _sweep(*args)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    rows = {r["problem"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"L1/19_ReLU", "L1/20_Huge"}  # --only: level 2 is not swept
    small, large = rows["L1/19_ReLU"], rows["L1/20_Huge"]
    assert small["outcome"] == "judged" and small["standard"]["status"] == "correct"
    assert small["verified"]["status"] == "no_custom_kernel" and small["verified"]["ratio"] > 0
    assert small["verified"]["prepare_calls"] > 0
    # where each pair's time went: the whole pair and its stages, under both protocols
    for protocol in ("standard", "verified"):
        entry = small[protocol]
        assert entry["pair_s"] > 0 and "timing" in entry["stages_s"], entry
        # an identity's ratio far from 1 must say which side moved: both sides' times and the timer's notes
        ms = entry["ms"]
        assert ms["candidate"]["median"] > 0 and ms["baseline"]["median"] > 0 and ms["candidate"]["n"] > 0, ms
        assert isinstance(entry["timing_notes"], list)
    assert json.loads(out.read_text())["summary"]["prepare_over_standard_pair_median"] > 0
    assert large["outcome"] == "refused" and "GiB of host memory" in large["why"]
    assert "| L1/20_Huge | 256 GiB |" in page.read_text()
    again = _sweep(*args, "--resume", str(out))
    assert again.returncode == 0 and "2 problems kept" in again.stdout and "[1/" not in again.stdout
    # a refusal made on another device is tried again (a problem too large for one card may fit another);
    # a judged row is kept whatever made it, and the page says which device made which rows
    data = json.loads(out.read_text())
    for r in data["rows"]:
        r["device"] = "NVIDIA H100 80GB HBM3"
    out.write_text(json.dumps(data))
    other = _sweep(*args, "--resume", str(out))
    assert other.returncode == 0 and "1 problems kept" in other.stdout, other.stdout[-2000:]
    assert "L1/20_Huge standard" in other.stdout and "L1/19_ReLU standard" not in other.stdout
    assert "NVIDIA H100 80GB HBM3 (1 rows)" in page.read_text()
    # an --only run re-judges its selection and keeps the resumed file's other rows as they were (a device
    # call that re-ran one problem once left only that problem in the file, and the next call began again)
    data = json.loads(out.read_text())
    published = {**data["rows"][0], "problem": "L2/1_Other", "outcome": "false flag", "why": "kept as published"}
    gone = {**data["rows"][0], "problem": "L9/99_Gone"}  # a problem no longer in the tree stays, and counts as none left
    out.write_text(json.dumps({**data, "rows": [*data["rows"], published, gone]}))
    third = _sweep(*args, "--resume", str(out))
    assert third.returncode == 0 and "2 problems kept" in third.stdout, third.stdout[-2000:]
    data = json.loads(out.read_text())
    rows = {r["problem"]: r for r in data["rows"]}
    assert set(rows) == {"L1/19_ReLU", "L1/20_Huge", "L2/1_Other", "L9/99_Gone"} and rows["L2/1_Other"] == published
    assert data["summary"]["remaining"] == 0
    assert "L2/1_Other" in page.read_text() and "--only" not in page.read_text()  # the page is the whole sweep's
    # --again measures a judged row of the selection once more (an H100 row said standard 3.41x with no
    # times kept), not from the resumed file nor from the run directory, and keeps every other row
    judged = rows["L1/19_ReLU"]
    retry = [a if a != "L1/19,L1/20" else "L1/19" for a in args]
    fresh = _sweep(*retry, "--resume", str(out), "--again")
    assert fresh.returncode == 0 and "L1/19_ReLU standard" in fresh.stdout and "kept" not in fresh.stdout, \
        fresh.stdout[-2000:]
    rows = {r["problem"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"L1/19_ReLU", "L1/20_Huge", "L2/1_Other", "L9/99_Gone"} and rows["L2/1_Other"] == published
    assert rows["L1/19_ReLU"]["outcome"] == "judged"
    assert rows["L1/19_ReLU"]["verified"]["pair_s"] != judged["verified"]["pair_s"]  # measured again
    assert json.loads(out.read_text())["summary"]["remaining"] == 0
    whole = [a for a in args if a not in ("--only", "L1/19,L1/20")]
    refused = _sweep(*whole, "--again")
    assert refused.returncode == 2 and "--again needs --only" in refused.stderr, refused.stderr[-500:]


def test_each_chunk_evaluates_its_own_problems_and_the_json_holds_every_row(tmp_path: Path) -> None:
    huge = RELU_PROBLEM.replace("torch.randn(16, 256)", "torch.randn(1 << 20, 1 << 16)")  # refused: stands as a failure
    tree = write_tree(tmp_path / "KernelBench", {"level1/20_Huge.py": huge, "level2/1_Other.py": RELU_PROBLEM})
    out, page = tmp_path / "sweep.json", tmp_path / "sweep.md"
    done = _sweep(str(tree), "--device", "cpu", "--work", str(tmp_path / "work"), "--timer-budget", "0.3",
                  "--seed", "3", "--chunk", "1", "--out", str(out), "--markdown", str(page))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads(out.read_text())
    assert [(r["problem"], r["outcome"]) for r in data["rows"]] == [("L1/20_Huge", "refused"), ("L2/1_Other", "judged")]
    assert data["summary"]["remaining"] == 0 and "not evaluated yet" not in page.read_text()
    assert "chunk 2/2" in done.stdout and done.stdout.count("L1/20_Huge standard") == 1  # not tried again


def test_two_lanes_judge_their_problems_side_by_side_and_the_rows_say_so(tmp_path: Path) -> None:
    tree = write_tree(tmp_path / "KernelBench", {"level1/19_ReLU.py": RELU_PROBLEM, "level2/1_Other.py": RELU_PROBLEM})
    out, page = tmp_path / "sweep.json", tmp_path / "sweep.md"
    done = _sweep(str(tree), "--device", "cpu", "--work", str(tmp_path / "work"), "--timer-budget", "0.3",
                  "--seed", "3", "--pairs-per-device", "2", "--out", str(out), "--markdown", str(page))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["problem"], r["outcome"]) for r in rows] == [("L1/19_ReLU", "judged"), ("L2/1_Other", "judged")]
    assert all(r["pairs_per_device"] == 2 for r in rows)  # a row judged beside another lane says so
    assert "2 rows were judged with 2 pairs a device at once" in page.read_text()


def test_no_chunk_starts_past_the_budget_and_a_resumed_sweep_goes_on(tmp_path: Path) -> None:
    tree = write_tree(tmp_path / "KernelBench", {"level1/19_ReLU.py": RELU_PROBLEM, "level2/1_Other.py": RELU_PROBLEM})
    out, page = tmp_path / "sweep.json", tmp_path / "sweep.md"
    args = [str(tree), "--device", "cpu", "--work", str(tmp_path / "work"), "--timer-budget", "0.3", "--seed", "3",
            "--chunk", "1", "--out", str(out), "--markdown", str(page)]
    cut = _sweep(*args, "--budget", "0.001")
    assert cut.returncode == 0, cut.stdout[-3000:] + cut.stderr[-3000:]
    data = json.loads(out.read_text())
    assert [r["problem"] for r in data["rows"]] == ["L1/19_ReLU"] and data["summary"]["remaining"] == 1
    assert "1 problems left for a later run" in cut.stdout and "chunk 2/2" not in cut.stdout
    assert "1 not evaluated yet" in page.read_text()
    rest = _sweep(*args, "--resume", str(out))
    assert rest.returncode == 0 and "1 problems kept" in rest.stdout and "L1/19_ReLU standard" not in rest.stdout
    data = json.loads(out.read_text())
    assert [r["outcome"] for r in data["rows"]] == ["judged", "judged"] and data["summary"]["remaining"] == 0
    # rows evaluated again (false flags here) stay in the file until this run's rows replace them: past
    # the budget, the one not reached is still there
    flagged = [{**r, "outcome": "false flag", "why": "as published"} for r in data["rows"]]
    out.write_text(json.dumps({**data, "rows": flagged}))
    again = _sweep(*args, "--budget", "0.001", "--resume", str(out))
    assert again.returncode == 0 and "chunk 2/2" not in again.stdout, again.stdout[-2000:]  # L1/19's from the run directory
    rows = {r["problem"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["L1/19_ReLU"]["outcome"] == "judged" and rows["L2/1_Other"] == flagged[1]


def test_a_sweep_killed_inside_a_chunk_keeps_the_problems_it_finished(tmp_path: Path) -> None:
    """A device call's limit kills the sweep wherever it is: the rows of the chunk's finished problems are
    already written (one chunk on an H100 took 540 s, and a kill at its end once lost all of it)."""
    tree = write_tree(tmp_path / "KernelBench", {"level1/19_ReLU.py": RELU_PROBLEM, "level2/1_Other.py": RELU_PROBLEM})
    out = tmp_path / "sweep.json"
    args = [str(tree), "--device", "cpu", "--work", str(tmp_path / "work"), "--timer-budget", "0.3", "--seed", "3",
            "--chunk", "8", "--out", str(out)]
    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.Popen([sys.executable, str(SCRIPT), *args], env={**os.environ, "PYTHONPATH": path},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 600
        while not out.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert out.exists(), "no row was written before the chunk ended"
    finally:
        proc.kill()
        proc.wait()
    data = json.loads(out.read_text())
    assert [r["problem"] for r in data["rows"]] == ["L1/19_ReLU"] and data["rows"][0]["outcome"] == "judged"
    assert data["summary"]["remaining"] == 1
    rest = _sweep(*args, "--resume", str(out))
    assert rest.returncode == 0 and "1 problems kept" in rest.stdout and "L1/19_ReLU standard" not in rest.stdout


def test_a_problem_half_judged_by_an_earlier_call_is_written_as_soon_as_its_other_half_is(tmp_path: Path) -> None:
    """On a warm GPU box a sweep call goes on from the run directory the call before left: a problem whose
    standard pair was judged there and whose verified pair is judged now is written at once, and so is
    one the earlier call finished (on an H200 four such rows were missing when the call's limit came)."""
    tree = write_tree(tmp_path / "KernelBench", {"level1/19_ReLU.py": RELU_PROBLEM, "level2/1_Other.py": RELU_PROBLEM})
    work = tmp_path / "work"
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from kernelbench_sweep import write_candidates\n"
            "from kbv.api import EvalConfig, evaluate\nfrom kbv.problems import load_problems\n"
            "problems = [p for p in load_problems(sys.argv[2]) if p.key == 'L1/19_ReLU']\n"
            "write_candidates(problems, __import__('pathlib').Path(sys.argv[3]) / 'chunk')\n"
            "evaluate(EvalConfig(candidates=sys.argv[3] + '/chunk', problems=sys.argv[2], protocol='standard', "
            "device='cpu', run_dir=sys.argv[3] + '/run', timer_budget_s=0.3, timeout_s=600.0, seed=3, "
            "time_unattributed=True))\n")
    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    subprocess.run([sys.executable, "-c", code, str(ROOT / "bench"), str(tree), str(work)], env=env, check=True,
                   capture_output=True, timeout=600)
    out = tmp_path / "sweep.json"
    proc = subprocess.Popen([sys.executable, str(SCRIPT), str(tree), "--device", "cpu", "--work", str(work),
                             "--timer-budget", "0.3", "--seed", "3", "--chunk", "8", "--out", str(out)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 600
        while not out.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        first = json.loads(out.read_text())  # the first write, before the chunk's end rewrites it
    finally:
        proc.kill()
        stdout = proc.communicate()[0]
    assert "L1/19_ReLU" in [r["problem"] for r in first["rows"]]
    row = next(r for r in first["rows"] if r["problem"] == "L1/19_ReLU")
    assert row["standard"]["status"] == "correct" and row["outcome"] == "judged"
    assert "L1/19_ReLU standard" not in stdout  # taken from the run directory, not evaluated again


def test_problems_the_plans_refuse_are_evaluated_last_and_a_bad_plans_file_is_one_line(tmp_path: Path) -> None:
    tree = write_tree(tmp_path / "KernelBench", {"level1/19_ReLU.py": RELU_PROBLEM, "level2/1_Other.py": RELU_PROBLEM})
    plans = tmp_path / "plans.json"
    plans.write_text(json.dumps({"rows": [{"problem": "L1/19_ReLU", "outcome": "refused"},
                                          {"problem": "L2/1_Other", "outcome": "held"}]}))
    args = [str(tree), "--device", "cpu", "--work", str(tmp_path / "work"), "--timer-budget", "0.3", "--seed", "3",
            "--chunk", "1", "--budget", "0.001", "--out", str(tmp_path / "sweep.json")]
    first = _sweep(*args, "--refused-last", str(plans))
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "L2/1_Other standard" in first.stdout and "L1/19_ReLU" not in first.stdout  # the one planned to fit first
    plans.write_text("{not json")
    bad = _sweep(*args, "--refused-last", str(plans))
    assert bad.returncode == 2 and bad.stderr.startswith("error: --refused-last") and "Traceback" not in bad.stderr


def test_an_identity_is_a_false_flag_under_any_verified_status_but_no_custom_kernel() -> None:
    """An identity's device error (KernelBench's L1/3 on an H100: `cuda_error`, the device full of the
    run's other problems) is a false flag like `incorrect`, never `judged`."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("kernelbench_sweep", SCRIPT)
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)

    def row(verified: str) -> dict:
        return {"problem": "L1/3_Batched", "standard": {"status": "correct", "message": ""},
                "verified": {"status": verified, "message": "VmmError: cuMemCreate"}}

    assert sweep.outcome(row("no_custom_kernel"), {}, {}) == ("judged", "")
    for status in ("cuda_error", "crashed", "timeout", "incorrect", "verified"):
        assert sweep.outcome(row(status), {}, {})[0] == "false flag", status
    assert sweep.outcome(row("unsound_problem"), {}, {"L1/3_Batched": "unsound"})[0] == "judged"
    assert sweep.outcome(row("unsound_problem"), {}, {"L1/3_Batched": "sound"})[0] == "false flag"


def test_published_rows_name_no_folder_of_the_machine() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("kernelbench_sweep", SCRIPT)
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    rows = [{"problem": "L1/19_ReLU", "why": "/data/kb/level1/19_ReLU.py: too large",
             "verified": {"status": "failed", "message": "/data/kb/level1/19_ReLU.py: too large"}}]
    out = sweep.portable(rows, "/data/kb/")
    assert out[0]["why"] == "KERNELBENCH_DIR/level1/19_ReLU.py: too large"
    assert out[0]["verified"]["message"].startswith("KERNELBENCH_DIR/level1/")
    assert rows[0]["why"].startswith("/data/kb/")  # the caller's rows are left as they were
