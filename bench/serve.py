"""`kbv serve` against `kbv eval` on the same candidates: pairs per minute, each request's latency, and
a cached answer's latency.

Loads (`--load`):
- `grpo` (the default): a GRPO step's rollouts, `--groups` problems x `--samples` candidates each
  (8 x 16), made from bench/templates.py's honest templates, every candidate its own, under the
  verified protocol; the service gets each group's samples as `/v1/evaluate_batch` requests of
  `--batch` items (16: a group at once), all of the step's requests at once from `--clients` clients.
  A group's samples of one kind share their kernels (a build per kind, not per sample);
- `examples`: the candidates of `--candidates` (examples/), one request per candidate.

1. `kbv eval`: the candidates under `--protocol`, the command in a process of its own, a fresh run
   directory, the builds warmed beforehand (so neither side times a build). Its wall time includes
   preparing each problem and starting every child: what a batch run costs. `--eval-budget` stops it
   (exit 3) where one invocation cannot hold it all; the same command continues its run, and the
   arm's wall time is the sum of its segments.
2. `kbv serve`, warm: a server (its own process, a fresh run directory, the same build cache, every
   problem kept prepared) is warmed with one throw-away candidate per problem (`ModelNew = Model`),
   then the candidates go as the load says. The wall time is from the first request to the last
   answer; each request's latency is from its sending to its answer.
3. Cached answers: every candidate sent again, `--cached` requests in all, one at a time and then from
   16 clients at once: latency percentiles of answers the store already holds.

Both arms run `--pairs-per-device` pairs per device at once. The verdicts of 1 and 2 are compared
(status of each pair and protocol): the service must judge as the batch run does. Targets (issue 26,
on the H200): the GRPO load through `kbv serve` at 30 verified pairs a minute or more, and at least
0.9x of `kbv eval`'s pairs a minute; a cached answer's p99 under 50 ms.

Resumable: `--out` is written after each part; a rerun with the same candidates and settings keeps
the parts it holds (the `kbv eval` arm, the served arm and its cached answers) and runs the rest.

    PYTHONPATH=src python3 bench/serve.py --device cpu --problems smoke --groups 3 --samples 4   # this machine
    PYTHONPATH=src python3 bench/serve.py --device cuda --problems full --pairs-per-device 2 --out serve.json
    PYTHONPATH=src python3 bench/serve.py --load examples --protocol both --device cuda --problems full
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))


def main() -> int:
    args = _parse()
    signal.signal(signal.SIGTERM, _stop)
    root = Path(args.workdir or tempfile.mkdtemp(prefix="kbv-bench-serve-"))
    root.mkdir(parents=True, exist_ok=True)
    cache = Path(args.cache_dir) if args.cache_dir else root / "cache"
    args.candidates = _candidate_set(args, root)
    pairs = _pairs(args)
    if not pairs:
        raise SystemExit(f"serve bench: no candidate pairs with a problem of {args.problems!r}")
    keys = _signatures(args, pairs)
    result = _resumed(args.out, keys)
    kept = [k if k != "eval" or result[k].get("complete") else "part of eval" for k in PARTS if k in result]
    print(f"{len(pairs)} candidates on {len({p for p, _ in pairs})} problems ({args.load} load), protocol "
          f"{args.protocol}, device {args.device}, {args.pairs_per_device} pair(s) per device; work in {root}"
          + (f"; kept from {args.out}: {', '.join(kept)}" if kept else ""), flush=True)
    result.update({"signature": keys["all"], "eval_signature": keys["eval"], "device": args.device,
                   "protocol": args.protocol, "load": args.load, "candidates": len(pairs),
                   "pairs_per_device": args.pairs_per_device, "batch": args.batch, "clients": args.clients})
    if len(kept) < len(PARTS):
        _warm_builds(args, root, cache)
    if not result.get("eval", {}).get("complete"):
        run = Path(result["eval_run"]) if "eval" in result else _fresh(root / "run-eval")
        result["eval_run"] = str(run)

        def keep(partial: dict[str, Any]) -> None:
            result["eval"] = partial
            _save(args.out, result)

        before = result.get("eval")
        keep({**(before or {"segments": []}), "running": time.time(), "complete": False})  # cut off: no figures
        result["eval"] = _eval(args, run, cache, before, keep)
        _save(args.out, result)
        if not result["eval"]["complete"]:
            print(f"kbv eval: stopped at its budget ({args.eval_budget:.0f} s) after {result['eval']['pairs']} of "
                  f"{len(pairs) * (2 if args.protocol == 'both' else 1)} pairs; the same command continues it",
                  flush=True)
            return 3
    print(f"kbv eval: {result['eval']['pairs']} pairs in {result['eval']['wall_s']:.1f} s", flush=True)
    if len(kept) < len(PARTS):
        run = Path(result["serve_run"]) if "serve" in result else _fresh(root / "run-serve")
        server = _start_server(args, run, cache, len({p for p, _ in pairs}))
        try:
            import httpx

            with httpx.Client(base_url=server["url"], timeout=None) as http:
                if "serve" not in result:
                    _warm_up(http, pairs, args.problems, args.protocol)
                    result["serve"] = _serve_pass(http, pairs, args)
                    result["serve_run"] = str(run)
                    result["disagreements"] = _disagreements(Path(result["eval_run"]), run)
                    _save(args.out, result)
                print(f"kbv serve: {result['serve']['pairs']} pairs in {result['serve']['wall_s']:.1f} s", flush=True)
                for name, clients in (("cached_sequential", 1), ("cached_concurrent", 16)):
                    if name not in result:
                        result[name] = _cached(http, pairs, args, clients=clients)
                        _save(args.out, result)
        finally:
            _end(server["proc"], 30)
    _print(result)
    return 0


CHILDREN: list[subprocess.Popen[str]] = []  # kbv eval and kbv serve while they run


def _end(proc: subprocess.Popen[str], wait_s: float) -> None:
    """Stop kbv eval or kbv serve: SIGTERM (it stores, or drains), `wait_s` for it, then a kill."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _stop(*_: object) -> None:
    """SIGTERM (a bound ran out): kbv eval stores what it finished and kbv serve stops; then exit."""
    for proc in CHILDREN:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    sys.exit(143)


PARTS = ("eval", "serve", "cached_sequential", "cached_concurrent")  # what a rerun keeps


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load", default="grpo", choices=("grpo", "examples"))
    parser.add_argument("--groups", type=int, default=8, help="grpo: problems in the step.")
    parser.add_argument("--samples", type=int, default=16, help="grpo: candidates per problem.")
    parser.add_argument("--batch", type=int, default=None,
                        help="Items per request (default: a group's samples for grpo, 1 for examples).")
    parser.add_argument("--candidates", default=str(ROOT / "examples"),
                        help="examples: a candidate directory, file or .jsonl.")
    parser.add_argument("--problems", default="smoke", help="The problems (a suite or a path).")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--protocol", default=None, choices=("standard", "verified", "both"),
                        help="Default: verified for grpo, both for examples.")
    parser.add_argument("--pairs-per-device", type=int, default=1)
    parser.add_argument("--clients", type=int, default=None,
                        help="Concurrent clients for pass 2 (0: everything as one batch; default: every "
                             "request at once for grpo, 8 for examples).")
    parser.add_argument("--eval-budget", type=float, default=None,
                        help="Seconds the kbv eval arm may run in this invocation; past it, it stops (exit 3) "
                             "and the same command continues it.")
    parser.add_argument("--cached", type=int, default=500, help="Cached requests per latency measurement.")
    parser.add_argument("--timer-budget", type=float, default=None, help="Verified timer budget (s); default kbv's.")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", default=None, help="Build cache (default: a fresh one under the work dir).")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    grpo = args.load == "grpo"
    if args.protocol is None:
        args.protocol = "verified" if grpo else "both"
    if args.batch is None:
        args.batch = args.samples if grpo else 1
    if args.clients is None:
        args.clients = max(1, args.groups * -(-args.samples // args.batch)) if grpo else 8
    for name in ("groups", "samples", "batch", "pairs_per_device"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def _candidate_set(args: argparse.Namespace, root: Path) -> str:
    """The candidates' path: `--candidates`, or the GRPO step's made now under the work directory."""
    if args.load != "grpo":
        return str(args.candidates)
    from templates import grpo

    from kbv.settings import resolve_device

    device_type = "cuda" if resolve_device(args.device).startswith("cuda") else "cpu"
    made = grpo(args.groups, args.samples, device_type)
    folder = root / f"grpo-{args.groups}x{args.samples}-{device_type}"
    if folder.exists():  # only this step's candidates, never an earlier one's left beside them
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for g in made:
        (folder / g.file_name).write_text(g.code)
    return str(folder)


def _signatures(args: argparse.Namespace, pairs: list[tuple[str, str]]) -> dict[str, str]:
    """What kept parts were measured on: `eval`, the kbv eval arm's (the pairs, the settings that move
    its figures, kbv's own source); `all`, every part's (the served side's settings too)."""
    def digest(*what: Any) -> str:
        return hashlib.sha256(json.dumps(what, default=str).encode()).hexdigest()[:16]

    code = hashlib.sha256()
    for f in sorted((ROOT / "src" / "kbv").rglob("*.py")):
        code.update(f.read_bytes())
    arm = digest(sorted((p, hashlib.sha256(c.encode()).hexdigest()) for p, c in pairs), args.protocol, args.device,
                 args.pairs_per_device, args.timer_budget, args.seed, args.problems, args.timeout, code.hexdigest())
    return {"eval": arm, "all": digest(arm, args.load, args.batch, args.clients, args.cached)}


def _resumed(out: str | None, keys: dict[str, str]) -> dict[str, Any]:
    """The parts an earlier run left in `out` that were measured as this one would measure them, and
    whose run directories are still there (the served arm's cached answers need its run; the
    verdicts' comparison needs both; an eval arm that stored nothing yet may have none). An eval
    segment still marked running was cut off before it could say how long it ran: its arm starts again."""
    if not out or not Path(out).is_file():
        return {}
    try:
        kept = json.loads(Path(out).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(kept, dict) or kept.get("eval_signature") != keys["eval"]:
        print(f"{out}: from other candidates, settings or code; measuring afresh", flush=True)
        return {}
    result: dict[str, Any] = {}
    arm = kept.get("eval")
    # a segment stopped before kbv eval made its run directory stored nothing: its time still counts
    there = bool(kept.get("eval_run")) and (Path(kept["eval_run"]).is_dir() or (
        isinstance(arm, dict) and arm.get("pairs") == 0 and not arm.get("complete")))
    if isinstance(arm, dict) and "running" not in arm and there:
        result.update({k: kept[k] for k in ("eval", "eval_run")})
        if (kept.get("signature") == keys["all"] and "serve" in kept and Path(kept.get("serve_run", "")).is_dir()
                and arm.get("complete")):
            result.update({k: kept[k] for k in ("serve", "serve_run", "disagreements", *PARTS[2:]) if k in kept})
    elif isinstance(arm, dict) and "running" in arm:
        print(f"{out}: its kbv eval segment was cut off without its wall time; that arm starts again", flush=True)
    return result


def _fresh(run: Path) -> Path:
    """`run`, or a new sibling where an earlier pass left one (its verdicts would be answered from store)."""
    n = 1
    fresh = run
    while fresh.exists():
        fresh, n = run.with_name(f"{run.name}-{n}"), n + 1
    return fresh


def _save(out: str | None, result: dict[str, Any]) -> None:
    if out:
        tmp = Path(f"{out}.tmp")
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(out)


def _config_kw(args: argparse.Namespace) -> dict[str, Any]:
    kw: dict[str, Any] = {"device": args.device, "seed": args.seed, "timeout_s": args.timeout,
                          "pairs_per_device": args.pairs_per_device}
    if args.timer_budget is not None:
        kw["timer_budget_s"] = args.timer_budget
    return kw


def _pairs(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(problem key, code) of every candidate that pairs with a problem."""
    from kbv.candidates import load_candidates
    from kbv.problems import load_problems

    pairing = load_candidates(args.candidates, load_problems(args.problems))
    return [(p.problem.key, p.candidate.code) for p in pairing.pairs if not p.candidate.no_code]


def _warm_builds(args: argparse.Namespace, root: Path, cache: Path) -> None:
    from kbv.api import EvalConfig, warm_builds

    t0 = time.monotonic()
    builds = warm_builds(EvalConfig(candidates=args.candidates, problems=args.problems, cache_dir=str(cache),
                                    run_dir=str(root / "run-builds"), **_config_kw(args)))
    print(f"builds warmed: {len(builds)} in {time.monotonic() - t0:.1f} s", flush=True)


def _eval(args: argparse.Namespace, run: Path, cache: Path, kept: dict[str, Any] | None,
          on_stop: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """`kbv eval` as a user runs it (its own process), on the run directory `run`; `kept`: the
    segments an earlier invocation ran there before its `--eval-budget` stopped it, which this one
    continues (`kbv eval` resumes its run): the arm's wall time is every segment's, so a resumed arm
    also pays its problems' preparation again, against itself. A segment cut short (the budget, or this
    bench's own SIGTERM) goes to `on_stop` before anything else happens."""
    command = [sys.executable, "-m", "kbv", "eval", args.candidates, "--problems", args.problems, "--protocol",
               args.protocol, "--device", args.device, "--run", str(run), "--cache-dir", str(cache), "--seed",
               str(args.seed), "--timeout", str(args.timeout), "--pairs-per-device", str(args.pairs_per_device)]
    if args.timer_budget is not None:
        command += ["--timer-budget", str(args.timer_budget)]
    segments = list((kept or {}).get("segments", []))
    t0 = time.monotonic()
    log = run.with_name(f"{run.name}.log")  # its progress lines, every segment's
    with log.open("a") as sink:
        proc = subprocess.Popen(command, env=_env(), stdout=subprocess.DEVNULL, stderr=sink, text=True)
    CHILDREN.append(proc)
    stopped = True
    try:
        proc.wait(timeout=args.eval_budget)
        stopped = False
    except subprocess.TimeoutExpired:  # the budget: kbv eval stores what it finished and stops (within 3 s)
        pass
    finally:  # the budget, or this bench stopped too (SIGTERM): the segment is kept all the same
        if proc.poll() is None:  # waits within `timeout --kill-after=10`, which would lose the segment
            _end(proc, 6)
        CHILDREN.remove(proc)
        partial = _segment(run, segments, time.monotonic() - t0, complete=False) if stopped else None
        if partial is not None:
            on_stop(partial)
    if partial is not None:
        return partial
    if proc.returncode != 0:
        last = (log.read_text().strip().splitlines() or [""])[-1]
        raise SystemExit(f"kbv eval failed (exit {proc.returncode}): {last} (all of it in {log})")
    return _segment(run, segments, time.monotonic() - t0, complete=True)


def _segment(run: Path, segments: list[float], wall: float, complete: bool) -> dict[str, Any]:
    """The eval arm's figures after one more segment of `wall` seconds: the run's verdicts so far."""
    from kbv.api import load_report

    try:
        done = len(load_report(run).verdicts)
    except Exception:  # noqa: BLE001 - stopped before its store was made
        done = 0
    segments = [*segments, round(wall, 2)]
    total = sum(segments)
    return {"pairs": done, "wall_s": round(total, 2), "pairs_per_min": round(60 * done / total, 2),
            "segments": segments, "complete": complete}


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)}


def _start_server(args: argparse.Namespace, run: Path, cache: Path, problems: int) -> dict[str, Any]:
    command = [sys.executable, "-m", "kbv", "serve", "--port", "0", "--device", args.device, "--problems",
               args.problems, "--run", str(run), "--cache-dir", str(cache), "--seed", str(args.seed),
               "--timeout", str(args.timeout), "--keep-problems", str(max(1, problems)), "--max-queue", "100000",
               "--pairs-per-device", str(args.pairs_per_device)]
    if args.timer_budget is not None:
        command += ["--timer-budget", str(args.timer_budget)]
    proc = subprocess.Popen(command, env=_env(), stdout=subprocess.PIPE, text=True)
    CHILDREN.append(proc)
    assert proc.stdout is not None
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if select.select([proc.stdout], [], [], 0.5)[0]:
            line = proc.stdout.readline()
            if line.startswith("kbv serve: http://"):
                print(line.strip(), flush=True)
                return {"proc": proc, "url": line.split()[2]}
    proc.kill()
    raise SystemExit("kbv serve did not come up")


def _warm_up(http: Any, pairs: list[tuple[str, str]], problems: str, protocol: str) -> None:
    """Prepare every problem with a throw-away candidate of its own (the reference as ModelNew)."""
    from kbv.problems import load_problems

    keys = sorted({p for p, _ in pairs})
    sources = {p.key: p.code for p in load_problems(problems)}
    items = [{"problem": k, "code": sources[k] + "\n\nModelNew = Model  # kbv bench: warm-up\n", "protocol": protocol}
             for k in keys]
    t0 = time.monotonic()
    response = http.post("/v1/evaluate_batch", json={"items": items})
    response.raise_for_status()
    print(f"warm-up: {len(items)} problems prepared in {time.monotonic() - t0:.1f} s", flush=True)


def _serve_pass(http: Any, pairs: list[tuple[str, str]], args: argparse.Namespace) -> dict[str, Any]:
    """The candidates through the service: requests of `--batch` consecutive items (the grpo load lists
    them group by group, so a batch of `--samples` is a group), sent by `--clients` clients; every
    request's latency."""
    items = [{"problem": p, "code": c, "protocol": args.protocol} for p, c in pairs]
    per_item = 2 if args.protocol == "both" else 1
    if args.clients <= 0:
        requests, clients = [items], 1
    else:
        requests = [items[i:i + args.batch] for i in range(0, len(items), args.batch)]
        clients = args.clients

    def one(batch: list[dict[str, str]]) -> float:
        t0 = time.perf_counter()
        if len(batch) == 1:
            response = http.post("/v1/evaluate", json=batch[0])
        else:
            response = http.post("/v1/evaluate_batch", json={"items": batch})
        response.raise_for_status()
        return time.perf_counter() - t0

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        latencies = sorted(pool.map(one, requests))
    wall = time.monotonic() - t0
    pairs_done = len(items) * per_item
    mode = ("one batch" if args.clients <= 0 else
            f"{len(requests)} requests of {args.batch} from {clients} clients" if args.batch > 1 else
            f"{clients} clients")
    return {"pairs": pairs_done, "wall_s": round(wall, 2), "pairs_per_min": round(60 * pairs_done / wall, 2),
            "mode": mode, "requests": len(requests), "request_p50_s": round(_percentile(latencies, 50), 2),
            "request_p99_s": round(_percentile(latencies, 99), 2), "request_max_s": round(latencies[-1], 2)}


def _cached(http: Any, pairs: list[tuple[str, str]], args: argparse.Namespace, clients: int) -> dict[str, Any]:
    items = [{"problem": p, "code": c, "protocol": args.protocol} for p, c in pairs]
    requests = [items[i % len(items)] for i in range(args.cached)]

    def one(item: dict[str, str]) -> float:
        t0 = time.perf_counter()
        response = http.post("/v1/evaluate", json=item)
        took = time.perf_counter() - t0
        response.raise_for_status()
        assert response.json()["cached"], "a resubmission was evaluated again"
        return took * 1000

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        latencies = sorted(pool.map(one, requests))
    wall = time.monotonic() - t0
    return {"clients": clients, "n": len(latencies), "answers_per_s": round(len(latencies) / wall, 1),
            "p50_ms": round(_percentile(latencies, 50), 2), "p99_ms": round(_percentile(latencies, 99), 2),
            "max_ms": round(latencies[-1], 2)}


def _percentile(ordered: list[float], q: float) -> float:
    index = min(len(ordered) - 1, max(0, int(round(q / 100 * len(ordered) + 0.5)) - 1))
    return ordered[index]


def _disagreements(eval_run: Path, serve_run: Path) -> list[str]:
    """Pairs and protocols whose status differs between the two runs (the warm-up's are left out)."""
    from kbv.api import load_report

    def statuses(run: Path) -> dict[tuple[str, str, str], str]:
        return {(v.problem, v.candidate_hash, v.protocol): v.status.value for v in load_report(run).verdicts}

    ran, served = statuses(eval_run), statuses(serve_run)
    return [f"{k[0]} {k[1][:12]} {k[2]}: eval {ran[k]}, serve {served.get(k, 'missing')}"
            for k in ran if served.get(k) != ran[k]]


def _print(r: dict[str, Any]) -> None:
    e, s, c1, c16 = r["eval"], r["serve"], r["cached_sequential"], r["cached_concurrent"]
    ratio = s["pairs_per_min"] / e["pairs_per_min"] if e["pairs_per_min"] else float("nan")
    segments = len(e.get("segments", [None]))
    rows = [(f"kbv eval ({segments} segment{'s' if segments > 1 else ''})", e["pairs"], e["wall_s"], e["pairs_per_min"]),
            (f"kbv serve, warm ({s['mode']})", s["pairs"], s["wall_s"], s["pairs_per_min"])]
    print(f"\n{r['load']} load, {r['protocol']}, {r['device']}, {r['pairs_per_device']} pair(s) per device")
    print(f"{'':52s} {'pairs':>6s} {'wall s':>8s} {'pairs/min':>10s}")
    for name, n, wall, rate in rows:
        print(f"{name:52s} {n:6d} {wall:8.1f} {rate:10.1f}")
    print(f"{'serve / eval':52s} {'':6s} {'':8s} {ratio:10.2f}")
    if "request_p50_s" in s:
        print(f"\n{'served requests':52s} {'n':>6s} {'p50 s':>8s} {'p99 s':>8s} {'max s':>8s}")
        print(f"{s['mode']:52s} {s['requests']:6d} {s['request_p50_s']:8.2f} {s['request_p99_s']:8.2f} "
              f"{s['request_max_s']:8.2f}")
    print(f"\n{'cached answers':52s} {'n':>6s} {'per s':>8s} {'p50 ms':>8s} {'p99 ms':>8s} {'max ms':>8s}")
    for name, m in (("one client", c1), ("16 clients", c16)):
        print(f"{name:52s} {m['n']:6d} {m['answers_per_s']:8.1f} {m['p50_ms']:8.2f} {m['p99_ms']:8.2f} {m['max_ms']:8.2f}")
    print(f"\nsame verdicts as kbv eval: {'yes' if not r['disagreements'] else 'no'}")
    for line in r["disagreements"]:
        print(f"  {line}")
    p99 = max(c1["p99_ms"], c16["p99_ms"])
    verdict = ("not judged: kbv eval ran in segments, each paying start-up and preparation again"
               if segments > 1 else "met" if ratio >= 0.9 else "not met")
    targets = [f"serve >= 0.9x eval pairs/min: {verdict} ({ratio:.2f}x)",
               f"cached p99 < 50 ms: {'met' if p99 < 50 else 'not met'} ({p99:.1f} ms)"]
    if r["load"] == "grpo" and r["protocol"] == "verified":
        rate = s["pairs_per_min"]
        targets.insert(0, f"served >= 30 verified pairs/min: {'met' if rate >= 30 else 'not met'} ({rate:.1f})")
    print("targets (issue 26, on the H200): " + "; ".join(targets))


if __name__ == "__main__":
    sys.exit(main())
