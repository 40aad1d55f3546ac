"""The results database: verdicts round-trip, re-running resumes, a SIGKILLed run loses nothing it
wrote, and a database of another schema is refused."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kbv.api import EvalConfig, evaluate
from kbv.errors import StoreError
from kbv.store import DB_NAME, Store, open_store, pair_key
from kbv.verdict import Category, Finding, MemoryStats, Status, Timing, TimingStats, Trial, Verdict
from sources import HONEST_RELU, SLOW_RELU, WRONG_RELU, write_tree


def _rich_verdict(**changes: object) -> Verdict:
    base = Verdict(
        problem="L1/19_ReLU", problem_hash="ph", level=1, candidate="19_ReLU__x", candidate_hash="ch",
        protocol="standard", protocol_version="v1", status=Status.INCORRECT, message="1/2 trials passed",
        categories=(Category.VALUE_MISMATCH, Category.SIDE_STREAM),
        trials=(Trial("default", 0, True, 0.0, 0.0),
                Trial("signed", 1, False, 2.5, 1.0, category=Category.VALUE_MISMATCH, note="max abs error 2.5")),
        timing=Timing("host-timer", "mean_ms", TimingStats.of([1.0, 2.0, 3.0]),
                      baselines={"eager": TimingStats.of([2.0, 4.0])}, speedups={"eager": 1.5},
                      speedup_ci={"eager": (1.2, 1.8)}, notes=("n",)),
        memory=MemoryStats(100, 0), baseline_memory=MemoryStats(50, 0, 7),
        findings=(Finding("S101", Category.SIDE_STREAM, "warning", "a stream", line=3, source="python"),),
        flags=("unsound:small",), evidence={"traceback": "Traceback ...", "returncode": -11},
        provenance={"torch": "2.x"}, model="m", sample=2, wall_s=1.25)
    from dataclasses import replace
    return replace(base, **changes)


def test_a_verdict_round_trips_through_the_store(tmp_path: Path) -> None:
    verdict = _rich_verdict()
    with open_store(tmp_path) as store:
        store.put_verdict("k1", verdict)
    with open_store(tmp_path, create=False) as store:
        assert store.verdicts() == [verdict]
        assert store.keys() == {"k1"}


def test_verdicts_come_back_in_write_order_and_a_key_is_replaced(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        store.put_verdict("b", _rich_verdict(candidate="first"))
        store.put_verdict("a", _rich_verdict(candidate="second"))
        store.put_verdict("b", _rich_verdict(candidate="first, again"))
        assert [v.candidate for v in store.verdicts()] == ["second", "first, again"]
        assert [v.candidate for v in store.verdicts(["b"])] == ["first, again"]


def test_pair_key_covers_everything_that_changes_a_verdict() -> None:
    args = ("ph", "ch", "name", "model", 0, "rules", "device")
    key = pair_key(*args)
    assert key == pair_key(*args)
    for i, other in enumerate(("ph2", "ch2", "name2", "model2", 1, "rules2", "device2")):
        changed = list(args)
        changed[i] = other
        assert pair_key(*changed) != key, f"argument {i} does not reach the key"


def test_a_missing_run_is_a_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="No kbv run at"):
        open_store(tmp_path / "nothing", create=False)


def test_a_database_of_another_schema_is_refused(tmp_path: Path) -> None:
    Store(tmp_path / DB_NAME).close()
    with sqlite3.connect(tmp_path / DB_NAME) as db:
        db.execute("UPDATE meta SET value='999' WHERE key='schema_version'")
    db.close()
    with pytest.raises(StoreError, match=r"kbv\.sqlite: written by schema 999, this kbv reads schema 1"):
        open_store(tmp_path)


def test_a_file_that_is_not_a_database_is_a_store_error(tmp_path: Path) -> None:
    (tmp_path / DB_NAME).write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="cannot open the results database"):
        open_store(tmp_path)


# -- resume --------------------------------------------------------------------------------------

def test_rerunning_resumes_and_evaluates_only_what_changed(tmp_path: Path, relu_problems: Path,
                                                           cache_dir: Path) -> None:
    cands = write_tree(tmp_path / "c", {"19_ReLU__a.py": HONEST_RELU, "19_ReLU__b.py": WRONG_RELU})
    config = EvalConfig(candidates=str(cands), problems=str(relu_problems), device="cpu",
                        run_dir=str(tmp_path / "run"), cache_dir=str(cache_dir), timeout_s=120)
    first = evaluate(config)
    assert (first.evaluated, first.resumed) == (2, 0)

    again = evaluate(config)
    assert (again.evaluated, again.resumed) == (0, 2)
    assert [v.to_dict() for v in again.verdicts] == [v.to_dict() for v in first.verdicts]

    write_tree(cands, {"19_ReLU__b.py": HONEST_RELU + "# fixed\n", "19_ReLU__c.py": HONEST_RELU})
    third = evaluate(config)
    assert (third.evaluated, third.resumed) == (2, 1)  # b changed, c is new, a is as it was
    assert {v.candidate: v.status for v in third.verdicts} == {
        "19_ReLU__a": Status.CORRECT, "19_ReLU__b": Status.CORRECT, "19_ReLU__c": Status.CORRECT}
    with open_store(tmp_path / "run", create=False) as store:
        assert len(store.invocations()) == 3


# -- SIGKILL mid-run -----------------------------------------------------------------------------

def _count_verdicts(db: Path) -> int:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as conn:
            return conn.execute("SELECT COUNT(*) FROM verdicts").fetchone()[0]
    except sqlite3.Error:
        return 0  # not created yet


def _processes_under(directory: Path) -> list[int]:
    """Pids of live processes whose working directory is inside `directory` (sandbox children)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(entry.joinpath("cwd").readlink()).startswith(str(directory)):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


@pytest.mark.slow
def test_a_killed_run_keeps_its_verdicts_and_resumes(tmp_path: Path, relu_problems: Path, cache_dir: Path) -> None:
    n = 4
    cands = write_tree(tmp_path / "c", {f"19_ReLU__slow{i}.py": SLOW_RELU + f"# {i}\n" for i in range(n)})
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "kbv", "eval", str(cands), "--problems", str(relu_problems), "--device", "cpu",
           "--run", str(run), "--cache-dir", str(cache_dir), "--timeout", "120"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1] / "src"),
                                                        os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while _count_verdicts(run / DB_NAME) < 1:
            assert proc.poll() is None, f"kbv eval ended early: {proc.stderr.read().decode()[-2000:]}"
            assert time.monotonic() < deadline, "no verdict written within 180 s"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL

    with sqlite3.connect(run / DB_NAME) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.close()
    with open_store(run, create=False) as store:
        written = store.verdicts()
    assert 1 <= len(written) < n, "the kill came too late to test anything"
    assert all(v.status is Status.CORRECT and v.speedup is not None for v in written)

    # The sandbox child the run left behind ends by itself once its parent's pipe is gone.
    deadline = time.monotonic() + 30
    while _processes_under(run) and time.monotonic() < deadline:
        time.sleep(0.2)
    orphans = _processes_under(run)
    for pid in orphans:
        os.kill(pid, signal.SIGKILL)
    assert not orphans, "a sandbox child outlived its killed parent by 30 s"

    resumed = evaluate(EvalConfig(candidates=str(cands), problems=str(relu_problems), device="cpu",
                                  run_dir=str(run), cache_dir=str(cache_dir), timeout_s=120))
    assert (resumed.evaluated, resumed.resumed) == (n - len(written), len(written))
    assert {v.candidate for v in resumed.verdicts} == {f"19_ReLU__slow{i}" for i in range(n)}
    before = {v.candidate: json.dumps(v.to_dict(), sort_keys=True) for v in written}
    after = {v.candidate: json.dumps(v.to_dict(), sort_keys=True) for v in resumed.verdicts}
    assert all(after[name] == text for name, text in before.items())  # written verdicts untouched


def test_get_verdicts_finds_the_stored_among_many_keys_and_answers_round_trip(tmp_path):
    store = Store(tmp_path / DB_NAME)
    verdicts = {f"k{i}": _rich_verdict(candidate=f"c{i}") for i in range(0, 1200, 7)}
    for key, verdict in verdicts.items():
        store.put_verdict(key, verdict)
    asked = [f"k{i}" for i in range(1200)] + ["k0"]  # past SQLite's bound-parameter limit, one twice
    assert store.get_verdicts(asked) == verdicts and store.get_verdicts([]) == {}
    answer = {"problem": "L1/19_ReLU", "candidate_hash": "ch", "protocol": "both", "keys": ["k0", "k7"],
              "status": "verified", "reward": 1.5, "reward_rule": "kernelbench-rl", "reward_version": 1, "cached": True}
    store.put_answer(answer)
    [stored] = store.answers()
    assert {k: v for k, v in stored.items() if k != "created_at"} == answer
    store.close()
