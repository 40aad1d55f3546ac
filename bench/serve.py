"""`kbv serve` against `kbv eval` on the same candidates: pairs per minute, and a cached answer's latency.

1. `kbv eval`: the candidate set under `--protocol`, one `evaluate` call in this process, a fresh run
   directory, the builds warmed beforehand (so neither side times a build). Its wall time includes
   preparing each problem and starting every child: what a batch run costs.
2. `kbv serve`, warm: a server (its own process, a fresh run directory, the same build cache, every
   problem kept prepared) is warmed with one throw-away candidate per problem (`ModelNew = Model`),
   then the candidate set goes as `--clients` concurrent clients, each sending its share one request
   at a time (as an RL loop's rollout workers would), or as one batch (`--clients 0`). The wall time is
   from the first request to the last answer.
3. Cached answers: every candidate sent again, `--cached` requests in all, one at a time and then from
   16 clients at once: latency percentiles of answers the store already holds.

The verdicts of 1 and 2 are compared (status of each pair and protocol): the service must judge as
the batch run does. Targets (issue 21): serve >= eval in pairs per minute (on the H200); a cached
answer's p99 under 50 ms. Prints a table; `--out` writes the figures as JSON.

    PYTHONPATH=src python3 bench/serve.py --device cpu --problems smoke              # this machine
    PYTHONPATH=src python3 bench/serve.py --device cuda --problems full --out serve.json   # a GPU
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    args = _parse()
    root = Path(args.workdir or tempfile.mkdtemp(prefix="kbv-bench-serve-"))
    cache = Path(args.cache_dir) if args.cache_dir else root / "cache"
    pairs = _pairs(args)
    print(f"{len(pairs)} candidates on {len({p for p, _ in pairs})} problems, protocol {args.protocol}, "
          f"device {args.device}; work in {root}", flush=True)
    _warm_builds(args, root, cache)
    result: dict[str, Any] = {"device": args.device, "protocol": args.protocol, "candidates": len(pairs)}
    result["eval"] = _eval(args, root / "run-eval", cache)
    print(f"kbv eval: {result['eval']['pairs']} pairs in {result['eval']['wall_s']:.1f} s", flush=True)
    server = _start_server(args, root / "run-serve", cache, len({p for p, _ in pairs}))
    try:
        import httpx

        with httpx.Client(base_url=server["url"], timeout=None) as http:
            _warm_up(http, pairs, args.problems, args.protocol)
            result["serve"] = _serve_pass(http, pairs, args)
            print(f"kbv serve: {result['serve']['pairs']} pairs in {result['serve']['wall_s']:.1f} s", flush=True)
            result["cached_sequential"] = _cached(http, pairs, args, clients=1)
            result["cached_concurrent"] = _cached(http, pairs, args, clients=16)
    finally:
        server["proc"].send_signal(signal.SIGTERM)
        server["proc"].wait(120)
    result["disagreements"] = _disagreements(root / "run-eval", root / "run-serve")
    _print(result)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--candidates", default=str(ROOT / "examples"), help="A candidate directory, file or .jsonl.")
    parser.add_argument("--problems", default="smoke", help="The problems (a suite or a path).")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--protocol", default="both", choices=("standard", "verified", "both"))
    parser.add_argument("--clients", type=int, default=8, help="Concurrent clients for pass 2 (0: one batch).")
    parser.add_argument("--cached", type=int, default=500, help="Cached requests per latency measurement.")
    parser.add_argument("--timer-budget", type=float, default=None, help="Verified timer budget (s); default kbv's.")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", default=None, help="Build cache (default: a fresh one under the work dir).")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--out", default=None)
    return parser.parse_args()


def _config_kw(args: argparse.Namespace) -> dict[str, Any]:
    kw: dict[str, Any] = {"device": args.device, "seed": args.seed, "timeout_s": args.timeout}
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


def _eval(args: argparse.Namespace, run: Path, cache: Path) -> dict[str, Any]:
    from kbv.api import EvalConfig, evaluate

    config = EvalConfig(candidates=args.candidates, problems=args.problems, protocol=args.protocol,
                        run_dir=str(run), cache_dir=str(cache), **_config_kw(args))
    t0 = time.monotonic()
    result = evaluate(config)
    wall = time.monotonic() - t0
    return {"pairs": result.evaluated, "wall_s": round(wall, 2), "pairs_per_min": round(60 * result.evaluated / wall, 2)}


def _start_server(args: argparse.Namespace, run: Path, cache: Path, problems: int) -> dict[str, Any]:
    command = [sys.executable, "-m", "kbv", "serve", "--port", "0", "--device", args.device, "--problems",
               args.problems, "--run", str(run), "--cache-dir", str(cache), "--seed", str(args.seed),
               "--timeout", str(args.timeout), "--keep-problems", str(max(1, problems)), "--max-queue", "100000"]
    if args.timer_budget is not None:
        command += ["--timer-budget", str(args.timer_budget)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
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
    items = [{"problem": p, "code": c, "protocol": args.protocol} for p, c in pairs]
    per_item = 2 if args.protocol == "both" else 1
    t0 = time.monotonic()
    if args.clients <= 0:
        response = http.post("/v1/evaluate_batch", json={"items": items})
        response.raise_for_status()
    else:
        def one(item: dict[str, str]) -> None:
            http.post("/v1/evaluate", json=item).raise_for_status()

        with ThreadPoolExecutor(max_workers=args.clients) as pool:
            list(pool.map(one, items))
    wall = time.monotonic() - t0
    pairs_done = len(items) * per_item
    mode = "one batch" if args.clients <= 0 else f"{args.clients} clients"
    return {"pairs": pairs_done, "wall_s": round(wall, 2), "pairs_per_min": round(60 * pairs_done / wall, 2),
            "mode": mode}


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
    rows = [("kbv eval (one evaluate call)", e["pairs"], e["wall_s"], e["pairs_per_min"]),
            (f"kbv serve, warm ({s['mode']})", s["pairs"], s["wall_s"], s["pairs_per_min"])]
    print(f"\n{'':34s} {'pairs':>6s} {'wall s':>8s} {'pairs/min':>10s}")
    for name, n, wall, rate in rows:
        print(f"{name:34s} {n:6d} {wall:8.1f} {rate:10.1f}")
    print(f"{'serve / eval':34s} {'':6s} {'':8s} {ratio:10.2f}")
    print(f"\n{'cached answers':34s} {'n':>6s} {'per s':>8s} {'p50 ms':>8s} {'p99 ms':>8s} {'max ms':>8s}")
    for name, m in (("one client", c1), ("16 clients", c16)):
        print(f"{name:34s} {m['n']:6d} {m['answers_per_s']:8.1f} {m['p50_ms']:8.2f} {m['p99_ms']:8.2f} {m['max_ms']:8.2f}")
    print(f"\nsame verdicts as kbv eval: {'yes' if not r['disagreements'] else 'no'}")
    for line in r["disagreements"]:
        print(f"  {line}")
    p99 = max(c1["p99_ms"], c16["p99_ms"])
    print(f"targets: serve >= eval pairs/min: {'met' if ratio >= 1 else 'not met'} ({ratio:.2f}x); "
          f"cached p99 < 50 ms: {'met' if p99 < 50 else 'not met'} ({p99:.1f} ms)")


if __name__ == "__main__":
    sys.exit(main())
