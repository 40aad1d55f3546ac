"""The identity sweep over KernelBench's problems: ModelNew is each problem's own Model, under both protocols.

For every problem (or `--only` a selection): the identity candidate (the problem's own source with
`ModelNew = Model`) through `kbv eval --protocol both`, with the bench-only `time_unattributed`
setting, so that the verified protocol times it against its live baseline although no kernel of its
own runs (its status stays `no_custom_kernel`, as an identity's must). One row a problem:

- standard's status and speedup (KernelBench's number for the same code: 1.00 up to its timer's noise);
- verified's status and the identity's time against the baseline's (1.00 is the truth), with its interval;
- the screen's flags, and what preparing the problem cost (reference calls, seconds, its share of the pair);
- or, for a problem kbv refuses, the figures it gave (a problem too large for the machine).

The outcome: `judged`; `refused` (with its figures); `failed` (the problem's own code failed); or
`false flag`, a bug: the identity anything but `no_custom_kernel` under verified (`incorrect`, `crashed`, `cuda_error`...),
`unsound_problem` on a problem the soundness screen (`--soundness`, its JSONL) called sound, or not
`correct` under standard.

Resumable: the run directory keeps every verdict (a rerun evaluates what is missing); `--resume` keeps
the rows of an earlier `--out` whose problems were judged, or refused on the same device (a fresh machine
goes on from the published JSON; each row names the device that made it); `--markdown` writes the page
(docs/kernelbench_sweep.md). Safe to kill: the problems are evaluated `--chunk` at a time, `--out` and
`--markdown` rewritten each time a problem has both protocols' outcomes, with every row so far (and how
many are not evaluated yet), so a kill loses only the problem in flight; no chunk after the first starts
past `--budget` seconds.

    PYTHONPATH=src python3 bench/kernelbench_sweep.py KERNELBENCH_DIR --device cuda \
        --out sweep.json --markdown docs/kernelbench_sweep.md [--resume docs/kernelbench_sweep.json]
    PYTHONPATH=src python3 bench/kernelbench_sweep.py KERNELBENCH_DIR --device cpu --only L1/12,L1/88,L1/19
    PYTHONPATH=src python3 bench/kernelbench_sweep.py KERNELBENCH_DIR --device cuda --only L1/64 --again \
        --resume docs/kernelbench_sweep.json --out sweep.json   # one published row measured again, the rest kept
    PYTHONPATH=src python3 bench/kernelbench_sweep.py KERNELBENCH_DIR --device cuda --budget 360 --chunk 8 \
        --out sweep.json [--resume sweep.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# what an identity may be under verified: no kernel of its own (timed all the same), or a problem the
# screen finds unsound; any other status (incorrect, hack, crashed, cuda_error, timeout...) is a false flag
IDENTITY_STATUSES = {"no_custom_kernel", "unsound_problem"}
IDENTITY_BAND = 0.05  # the verified identity ratio's target: 1.00 +- this
KEPT = ("judged", "refused")  # outcomes a resumed sweep keeps
AGAIN_RUN = "run-again"  # --again's run directory under --work, emptied at its start (`run/` keeps the sweep's)


def identity_source(problem_code: str) -> str:
    """The identity candidate: the problem's own module, its Model named ModelNew as well."""
    return problem_code.rstrip() + "\n\n\n# kbv sweep: the problem's own Model, as the candidate\nModelNew = Model\n"


def select(problems: list[Any], only: str) -> list[Any]:
    """The problems `only` names (comma-separated keys 'L1/19_ReLU', 'L1/19', or substrings of names)."""
    if not only:
        return problems
    wanted = [w.strip() for w in only.split(",") if w.strip()]

    def named(p: Any) -> bool:
        for w in wanted:
            if w == p.key or w in p.name:
                return True
            level, _, ident = w.partition("/")
            if level == f"L{p.level}" and ident.isdigit() and p.problem_id == int(ident):
                return True
        return False

    return [p for p in problems if named(p)]


def write_candidates(problems: list[Any], root: Path) -> None:
    """One identity candidate a problem, named for pairing: levelN/<stem>__identity.py."""
    for p in problems:
        path = root / f"level{p.level}" / f"{p.name}__identity.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        source = identity_source(p.code)
        if not path.exists() or path.read_text() != source:
            path.write_text(source)


def row_of(problem: Any, verdicts: dict[str, Any], failures: dict[str, str], sound: dict[str, str]) -> dict[str, Any]:
    """One problem's row (see the module's docstring)."""
    from kbv.footprint import problem_footprint

    fp = problem_footprint(problem)
    row: dict[str, Any] = {"problem": problem.key, "input_bytes": fp.input_bytes if fp else None,
                           "weight_bytes": fp.weight_bytes if fp else None}
    for protocol in ("standard", "verified"):
        v = verdicts.get(protocol)
        if v is None:
            row[protocol] = {"status": "failed" if protocol in failures else "missing",
                             "message": failures.get(protocol, "")[:1500]}
            continue
        entry: dict[str, Any] = {"status": v.status.value, "message": v.message[:1000]}
        if v.timing is not None and v.timing.speedups:
            name = next(iter(v.timing.speedups))
            entry["ratio"] = round(v.timing.speedups[name], 4)
            ci = (v.timing.speedup_ci or {}).get(name)
            entry["ci"] = [round(x, 4) for x in ci] if ci else None
            # an identity's two sides, and what the timer said: a ratio far from 1 names the side that moved
            base = v.timing.baselines.get(name)
            entry["ms"] = {"candidate": _ms(v.timing.candidate), **({"baseline": _ms(base)} if base else {})}
            entry["timing_notes"] = [str(n)[:200] for n in v.timing.notes][:8]
        # where the pair's time went (child start, preparation, correctness, timing...): a sweep of 250
        # problems must fit in device sessions, and the stages say what to cut
        entry["pair_s"] = round(float(v.evidence.get("pair_s") or 0.0), 2)
        entry["stages_s"] = {k: round(float(s), 2) for k, s in (v.evidence.get("stages_s") or {}).items() if s}
        if protocol == "verified":
            prep = v.evidence.get("preparation") or {}
            entry["protocol"] = v.protocol_version
            entry["flags"] = list(v.flags)
            entry["problem_notes"] = [str(n)[:300] for n in v.evidence.get("problem_notes") or []][:8]
            entry["prepare_calls"] = prep.get("calls")
            entry["prepare_s"] = prep.get("seconds")
            entry["prepare_seconds_by_purpose"] = prep.get("seconds_by_purpose") or {}
        row[protocol] = entry
    row["outcome"], row["why"] = outcome(row, failures, sound)
    return row


def _ms(stats: Any) -> dict[str, float]:
    """One side's timed calls, in ms: mean (standard's ratio), median (verified's), min, max, their count."""
    return {**{k: round(getattr(stats, f"{k}_ms"), 4) for k in ("mean", "median", "min", "max")}, "n": stats.n}


def outcome(row: dict[str, Any], failures: dict[str, str], sound: dict[str, str]) -> tuple[str, str]:
    """(outcome, why) of a row (pure)."""
    too_large = [m for m in failures.values() if "too large for this machine" in m]
    if too_large:
        return "refused", too_large[0][:400]
    if failures:
        return "failed", next(iter(failures.values()))[:400]
    std, ver = row["standard"], row["verified"]
    if "missing" in (std["status"], ver["status"]):
        return "missing", "not evaluated yet"
    if ver["status"] not in IDENTITY_STATUSES:  # crashed, cuda_error, timeout...: whatever else, a bug
        return "false flag", f"verified {ver['status']}: {ver['message']}"
    if ver["status"] == "unsound_problem" and sound.get(row["problem"]) == "sound":
        return "false flag", f"unsound_problem on a problem the screen calls sound: {ver['message']}"
    if std["status"] != "correct":
        return "false flag", f"standard {std['status']}: {std['message']}"
    return "judged", ""


def run(args: argparse.Namespace, problems: list[Any],
        finished: Callable[[list[dict[str, Any]]], None] = lambda rows: None) -> list[dict[str, Any]]:
    """Evaluate the identity of every problem in `problems` (resuming the run directory); their rows.

    The candidates go to a fresh `chunk/` under --work, so only these problems' pairs are evaluated
    (a verdict's resume key names the candidate, not its folder: earlier chunks' verdicts stay in `run/`).
    `finished` gets the rows of this chunk's problems done so far each time a problem has both protocols'
    outcomes, so a sweep killed mid-chunk (a device call's limit) loses only the problem in flight."""
    from kbv.api import EvalConfig, evaluate, load_report
    from kbv.store import DB_NAME

    work = Path(args.work)
    run_dir = work / (AGAIN_RUN if getattr(args, "again", False) else "run")
    shutil.rmtree(work / "chunk", ignore_errors=True)
    write_candidates(problems, work / "chunk")
    config = EvalConfig(candidates=str(work / "chunk"), problems=args.problems, protocol="both",
                        device=args.device, run_dir=str(run_dir), timer_budget_s=args.timer_budget,
                        timeout_s=args.timeout, prepare_timeout_s=args.prepare_timeout, seed=args.seed,
                        time_unattributed=True, pairs_per_device=getattr(args, "pairs_per_device", 1))

    started = time.monotonic()
    by_key = {p.key: p for p in problems}
    seen: dict[str, dict[str, Any]] = {}  # problem -> protocol -> its verdict or problem failure
    sound = soundness(args.soundness)
    device = _device_name(args.device)
    lanes = {"pairs_per_device": config.pairs_per_device} if config.pairs_per_device > 1 else {}

    if (run_dir / DB_NAME).is_file():  # what the run directory holds resumes without a progress call
        earlier = load_report(run_dir)
        for v in [*earlier.problem_failures, *earlier.verdicts]:  # a verdict stands over a failure
            if v.problem in by_key:
                seen.setdefault(v.problem, {})[v.protocol or "standard"] = v

    def progress(done: int, total: int, what: Any) -> None:
        if what is None:
            return
        label = getattr(what, "status", None)
        print(f"  [{done}/{total}] +{time.monotonic() - started:.0f}s {getattr(what, 'problem', '')} "
              f"{getattr(what, 'protocol', '')} {label.value if label is not None else 'problem failed'}",
              flush=True)
        if what.problem not in by_key:
            return
        seen.setdefault(what.problem, {})[what.protocol or "standard"] = what
        if len(seen[what.problem]) < 2:
            return
        rows = []
        for key, outcomes in seen.items():
            if len(outcomes) == 2:
                rows.append({**row_of(by_key[key], {k: o for k, o in outcomes.items() if hasattr(o, "status")},
                                      {k: o.message for k, o in outcomes.items() if not hasattr(o, "status")},
                                      sound), "device": device, **lanes})
        finished(rows)

    evaluate(config, progress=progress)
    report = load_report(run_dir)
    wanted = {p.key for p in problems}
    verdicts: dict[str, dict[str, Any]] = {}
    for v in report.verdicts:
        if v.problem in wanted:
            verdicts.setdefault(v.problem, {})[v.protocol] = v
    failures: dict[str, dict[str, str]] = {}
    for f in report.problem_failures:
        if f.problem in wanted:
            failures.setdefault(f.problem, {})[f.protocol or "standard"] = f.message
    return [{**row_of(p, verdicts.get(p.key, {}), failures.get(p.key, {}), sound), "device": device, **lanes}
            for p in problems]


def soundness(path: str | None) -> dict[str, str]:
    """problem -> outcome of the soundness screen's JSONL (the last line of each problem), or nothing."""
    if not path or not Path(path).is_file():
        return {}
    out: dict[str, str] = {}
    for line in Path(path).read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and "problem" in rec and "outcome" in rec:
            out[rec["problem"]] = rec["outcome"]
    return out


def summary(rows: list[dict[str, Any]], remaining: int = 0) -> dict[str, Any]:
    """Counts by outcome, the verified identity ratios (median, share within the band), preparation's share,
    and `remaining`: the problems of the tree not evaluated yet."""
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    ratios = [r["verified"]["ratio"] for r in rows if r["outcome"] == "judged" and r["verified"].get("ratio")]
    shares = [r["verified"]["prepare_s"] / r["verified"]["pair_s"] for r in rows
              if r["outcome"] == "judged" and r["verified"].get("prepare_s") and r["verified"].get("pair_s")]
    # the bound: verified's preparation takes no longer than standard's whole pair
    against_standard = [r["verified"]["prepare_s"] / r["standard"]["pair_s"] for r in rows
                        if r["outcome"] == "judged" and r["verified"].get("prepare_s") and r["standard"].get("pair_s")]
    return {"problems": len(rows), "outcomes": counts, "remaining": remaining,
            "prepare_over_standard_pair_median": (round(statistics.median(against_standard), 3)
                                                  if against_standard else None),
            "verified_ratio_median": round(statistics.median(ratios), 4) if ratios else None,
            "verified_ratio_within_band": sum(1 for x in ratios if abs(x - 1) <= IDENTITY_BAND),
            "verified_ratios": len(ratios),
            "prepare_share_median": round(statistics.median(shares), 3) if shares else None}


def print_table(rows: list[dict[str, Any]], remaining: int = 0) -> None:
    from kbv.footprint import format_bytes

    head = (f"{'problem':44s} {'inputs':>8s} {'standard':>10s} {'verified':>17s} {'ratio':>6s} {'prep':>7s} "
            f"{'pairs (s)':>9s}  outcome")
    print(head)
    print("-" * len(head))
    for r in rows:
        std, ver = r["standard"], r["verified"]
        size = format_bytes(r["input_bytes"]) if r.get("input_bytes") is not None else "?"
        ratio = f"{ver['ratio']:.2f}" if ver.get("ratio") else "-"
        prep = f"{ver['prepare_s']:.0f} s" if ver.get("prepare_s") else "-"
        pairs = "/".join(f"{e['pair_s']:.0f}" if e.get("pair_s") else "-" for e in (std, ver))
        print(f"{r['problem'][:44]:44s} {size:>8s} {std['status'][:10]:>10s} {ver['status'][:17]:>17s} {ratio:>6s} "
              f"{prep:>7s} {pairs:>9s}  {r['outcome']}{': ' + r['why'][:100] if r['why'] else ''}")
    s = summary(rows, remaining)
    print(f"\n{s['problems']} problems: " + ", ".join(f"{n} {o}" for o, n in s["outcomes"].items())
          + (f"; {remaining} not evaluated yet" if remaining else "")
          + (f"; verified identity ratio median {s['verified_ratio_median']:.3f}, {s['verified_ratio_within_band']}/"
             f"{s['verified_ratios']} within 1.00 +- {IDENTITY_BAND}" if s["verified_ratio_median"] else "")
          + (f"; preparation {100 * s['prepare_share_median']:.0f}% of a verified pair (median)"
             + (f", {s['prepare_over_standard_pair_median']:.2f}x standard's whole pair"
                if s["prepare_over_standard_pair_median"] is not None else "")
             if s["prepare_share_median"] is not None else ""))


def write_markdown(rows: list[dict[str, Any]], path: Path, command: str, device: str, remaining: int = 0) -> None:
    from kbv.footprint import format_bytes

    s = summary(rows, remaining)
    lines = ["# KernelBench's problems, each with its own Model as the candidate", "",
             "Every problem's identity (ModelNew = Model) under both protocols: standard's status and speedup, "
             "verified's status (`no_custom_kernel`, as an identity's must be) and its time against the live "
             "TF32 baseline (timed through the bench-only `time_unattributed` setting; 1.00 is the truth), "
             "and what preparing the problem cost. A problem too large for the machine is refused with its "
             "figures. A `false flag` (under verified, the identity anything but `no_custom_kernel`, or "
             "unsound on a problem the screen calls sound; under standard, not `correct`) is a bug.", "",
             f"Made on {_made_on(rows, device)} with: `{command}`", "",
             *_lanes_line(rows),
             f"{s['problems']} problems: " + ", ".join(f"{n} {o}" for o, n in s["outcomes"].items())
             + (f"; {remaining} not evaluated yet" if remaining else "")
             + (f". Verified identity ratio: median {s['verified_ratio_median']:.3f}, "
                f"{s['verified_ratio_within_band']} of {s['verified_ratios']} within 1.00 ± {IDENTITY_BAND}."
                if s["verified_ratio_median"] else "")
             + (f" Preparation: {100 * s['prepare_share_median']:.0f}% of a verified pair's time (median)"
                + (f", {s['prepare_over_standard_pair_median']:.2f}x standard's whole pair (median)"
                   if s["prepare_over_standard_pair_median"] is not None else "") + "."
                if s["prepare_share_median"] is not None else ""), "",
             "| problem | inputs | standard | verified | ratio [interval] | preparation | pairs (s) | outcome |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        std, ver = r["standard"], r["verified"]
        size = format_bytes(r["input_bytes"]) if r.get("input_bytes") is not None else "?"
        ratio = f"{ver['ratio']:.3f}" if ver.get("ratio") else "-"
        if ver.get("ci"):
            ratio += f" [{ver['ci'][0]:.3f}, {ver['ci'][1]:.3f}]"
        prep = (f"{ver['prepare_calls']} calls, {ver['prepare_s']:.0f} s" if ver.get("prepare_calls") is not None
                and ver.get("prepare_s") is not None else "-")
        std_cell = std["status"] + (f" {std['ratio']:.2f}x" if std.get("ratio") else "")
        why = (": " + r["why"].replace("|", "/")[:300]) if r["why"] else ""
        pairs = " / ".join(f"{e['pair_s']:.0f}" if e.get("pair_s") else "-" for e in (std, ver))
        lines.append(f"| {r['problem']} | {size} | {std_cell} | {ver['status']} | {ratio} | {prep} | {pairs} | "
                     f"{r['outcome']}{why} |")
    _write(path, "\n".join(lines) + "\n")


def portable(rows: list[dict[str, Any]], root: str) -> list[dict[str, Any]]:
    """`rows` with the problem tree's own path (`root`, as given) named KERNELBENCH_DIR in their messages,
    so that what is published names no folder of the machine that made it. Pure."""
    prefix = str(root).rstrip("/") + "/"

    def clean(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace(prefix, "KERNELBENCH_DIR/")
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        return value

    return [clean(r) for r in rows]


def write_outputs(args: argparse.Namespace, rows: list[dict[str, Any]], remaining: int, whole: bool = False) -> None:
    """The rows so far, in problem order, to --out (with the summary) and --markdown, each replaced whole;
    `whole`: the rows are a resumed sweep's with an --only selection's merged in (the page's command is
    then the sweep's, without --only)."""
    rows = portable(rows, args.problems)
    if args.out:
        _write(Path(args.out), json.dumps({"rows": rows, "summary": summary(rows, remaining)}, indent=1))
    if args.markdown:
        write_markdown(rows, Path(args.markdown), _command(args, selection=not whole), _device_name(args.device),
                       remaining)


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problems", help="KernelBench's repository, its problem folder, or any problem tree")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--only", default="", help="comma-separated: L1/19_ReLU, L1/19, or substrings of names")
    ap.add_argument("--work", default="kbv-runs/kernelbench-sweep", help="candidates and the run directory")
    ap.add_argument("--timer-budget", type=float, default=5.0)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--prepare-timeout", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--soundness", default="docs/kernelbench_soundness.jsonl",
                    help="the soundness screen's JSONL: unsound_problem where it said sound is a false flag")
    ap.add_argument("--resume", default=None, help="an earlier --out: its judged and refused rows are kept")
    ap.add_argument("--again", action="store_true",
                    help="with --only: evaluate the selection again, in a fresh run directory of its own, even "
                         "where --resume or --work judged it; every other row of --resume goes on as it was")
    ap.add_argument("--out", default=None, help="write the rows (and the summary) as JSON here")
    ap.add_argument("--markdown", default=None, help="write the page here (docs/kernelbench_sweep.md)")
    ap.add_argument("--pairs-per-device", type=int, default=1,
                    help="lanes a device: pairs prepared side by side, timed one at a time behind the gate")
    ap.add_argument("--chunk", type=int, default=8, help="problems a chunk: the outputs are written after each")
    ap.add_argument("--refused-last", default=None, metavar="PLANS_JSON",
                    help="bench/kernelbench_plans.py's --out for this device's size: the problems it plans to "
                         "refuse under verified are evaluated after every other one")
    ap.add_argument("--budget", type=float, default=0.0,
                    help="seconds since the start after which no chunk but the first starts (0: none)")
    args = ap.parse_args(argv)
    if args.chunk < 1:
        ap.error("--chunk must be at least 1")
    from kbv.api import MAX_PAIRS_PER_DEVICE

    if not 1 <= args.pairs_per_device <= MAX_PAIRS_PER_DEVICE:
        ap.error(f"--pairs-per-device must be 1 to {MAX_PAIRS_PER_DEVICE}")
    if args.again and not args.only:
        ap.error("--again needs --only: it measures a selection again")
    from kbv.errors import KbvError
    from kbv.problems import load_problems

    try:
        everything = load_problems(args.problems)
        problems = select(everything, args.only)
    except KbvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not problems:
        print(f"error: no problem of {args.problems} matches --only {args.only}", file=sys.stderr)
        return 2
    if args.again:  # nothing of the selection is kept: not the resumed rows, nor an earlier --again's verdicts
        shutil.rmtree(Path(args.work) / AGAIN_RUN, ignore_errors=True)
    kept = {} if args.again else _kept(args.resume, {p.key for p in problems}, _device_name(args.device))
    # every other row of the resumed file goes on to --out as it was until this run's row of its problem
    # replaces it: the rows of problems an --only run did not select, and the selection's rows that are
    # evaluated again (a failure, a false flag, a refusal made on another card) but not reached yet
    carried = _carried(args.resume, set(kept))
    selected, every_key = {p.key for p in problems}, {p.key for p in everything}
    beyond = any(r.get("problem") not in selected for r in carried)  # the file is more than the selection

    def written(rows: list[dict[str, Any]]) -> None:
        mine = {r["problem"] for r in rows}
        whole = _ordered([*(r for r in carried if r.get("problem") not in mine), *rows])
        write_outputs(args, whole, len(every_key - {r.get("problem") for r in whole}), whole=beyond)
    todo = [p for p in problems if p.key not in kept]
    if args.refused_last:
        try:
            todo = refused_last(todo, Path(args.refused_last))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"error: --refused-last {args.refused_last}: {exc}", file=sys.stderr)
            return 2
    if kept:
        print(f"{len(kept)} problems kept from {args.resume}; {len(todo)} to evaluate", flush=True)
    every = _ordered(list(kept.values()))
    chunks = [todo[i:i + args.chunk] for i in range(0, len(todo), args.chunk)]
    for i, chunk in enumerate(chunks):
        if i and args.budget and time.monotonic() - started >= args.budget:
            print(f"budget of {args.budget:g} s spent: {len(problems) - len(every)} problems left for a later run"
                  + (f" (--resume {args.out})" if args.out else ""), flush=True)
            break
        print(f"chunk {i + 1}/{len(chunks)}: {len(chunk)} problems", flush=True)
        done = every
        every = _ordered([*done, *run(args, chunk, lambda rows: written([*done, *rows]))])
        written(every)
    if not chunks:
        written(every)
    print_table(every, len(problems) - len(every))
    # this run's rows only: a false flag carried from the resumed file was not made by this run
    return 1 if any(r["outcome"] == "false flag" for r in every) else 0


def refused_last(problems: list[Any], plans: Path) -> list[Any]:
    """`problems` with those the plans (bench/kernelbench_plans.py's JSON) refuse under verified moved
    to the end, each group in its order: a device call goes to problems that can be judged first (on an
    H100, each 6 GiB elementwise problem took 90 s of standard pairs, then was refused under verified)."""
    refused = {r["problem"] for r in json.loads(plans.read_text())["rows"] if r.get("outcome") == "refused"}
    return [p for p in problems if p.key not in refused] + [p for p in problems if p.key in refused]


def _kept(path: str | None, keys: set[str], device: str) -> dict[str, dict[str, Any]]:
    """The rows of an earlier --out to keep: every judged one, and a refusal made on this same device (a
    problem too large for one card may fit another)."""
    if not path or not Path(path).is_file():
        return {}
    rows = json.loads(Path(path).read_text()).get("rows", [])
    return {r["problem"]: r for r in rows if r.get("problem") in keys and r.get("outcome") in KEPT
            and (r.get("outcome") != "refused" or r.get("device") == device)}


def _carried(path: str | None, keys: set[str]) -> list[dict[str, Any]]:
    """The rows of an earlier --out whose problems are not in `keys` (the rows kept)."""
    if not path or not Path(path).is_file():
        return []
    return [r for r in json.loads(Path(path).read_text()).get("rows", []) if r.get("problem") not in keys]


def _lanes_line(rows: list[dict[str, Any]]) -> list[str]:
    """What the page says of rows judged beside other lanes (`--pairs-per-device`; none: nothing)."""
    beside = [r for r in rows if (r.get("pairs_per_device") or 1) > 1]
    if not beside:
        return []
    lanes = sorted({r["pairs_per_device"] for r in beside})
    return [f"{len(beside)} rows were judged with {' or '.join(map(str, lanes))} pairs a device at once "
            "(`--pairs-per-device`, as set by the sweep call that wrote the row): their pairs prepared side by "
            "side, each timed window alone on the device behind the gate.", ""]


def _made_on(rows: list[dict[str, Any]], device: str) -> str:
    """'NVIDIA H100 80GB HBM3': the device of every row (this one where a row names none), with the
    count of each where they differ."""
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.get("device") or device] = counts.get(r.get("device") or device, 0) + 1
    if len(counts) <= 1:
        return next(iter(counts), device)
    return ", ".join(f"{name} ({n} rows)" for name, n in counts.items())


def _ordered(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: _order(r["problem"]))


def _write(path: Path, text: str) -> None:
    """`text` to `path` through a temporary file: a kill mid-write leaves the earlier file whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _order(key: str) -> tuple[int, int, str]:
    level, _, name = key.partition("/")
    ident = name.split("_", 1)[0]
    return (int(level.removeprefix("L") or 0), int(ident) if ident.isdigit() else 1 << 30, name)


def _command(args: argparse.Namespace, selection: bool = True) -> str:
    """The command that remakes the page, without this machine's paths (`selection`: with its --only)."""
    only = f" --only {args.only}" if args.only and selection else ""
    page = Path(args.markdown) if args.markdown else Path("docs/kernelbench_sweep.md")
    page = page if not page.is_absolute() else Path(page.name)  # a relative path is the repository's
    return (f"PYTHONPATH=src python3 bench/kernelbench_sweep.py KERNELBENCH_DIR --device {args.device}{only} "
            f"--timer-budget {args.timer_budget:g} --out {page.with_suffix('.json')} --markdown {page}")


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device)) if torch.cuda.is_available() else device
    import platform

    return f"a CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


if __name__ == "__main__":
    sys.exit(main())
