"""The `kbv` command: parse, build a config, call the API, render, exit.

Exit codes (`ExitCode`): 0 the command completed (whatever the verdicts); 1 some problems' own code
failed (their pairs have no verdict); 2 bad input (one line on stderr says why); 3 kbv itself failed;
130 interrupted (everything finished so far is stored).
"""

from __future__ import annotations

import enum
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape

from kbv.errors import HarnessError, KbvError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="kbv: KernelBench-Verified. Evaluate LLM-generated kernels under KernelBench's "
                       "protocol and a verified one, side by side.")
problems_app = typer.Typer(no_args_is_help=True, help="Inspect problem sets.")
app.add_typer(problems_app, name="problems")


def _register_optional_commands() -> None:
    from kbv.generate.command import generate_command
    from kbv.redteam.command import redteam_command
    from kbv.scan_command import scan_command

    app.command("generate", help="Ask an LLM for kernels, one turn each (KernelBench-style prompts).")(generate_command)
    app.command("scan", help="Static scan of candidate files: rules over Python and embedded CUDA/C++.")(scan_command)
    app.command("redteam", help="Attack kbv with known hacks: mutants of honest candidates under both protocols.")(
        redteam_command)


_register_optional_commands()

# Piped output is 160 wide unless COLUMNS says otherwise; the tables lay themselves out for the width.
out = Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160)
err = Console(stderr=True, soft_wrap=True)  # one message, one line: never wrapped


class ExitCode(enum.IntEnum):
    OK = 0
    PROBLEM_FAILURES = 1
    BAD_INPUT = 2
    HARNESS = 3
    INTERRUPTED = 130


@contextmanager
def _errors() -> Iterator[None]:
    """KbvError -> one line on stderr and a non-zero exit; no traceback for the user's mistakes."""
    try:
        yield
    except HarnessError as exc:
        err.print(f"[red]kbv failed:[/] {escape(str(exc))}", markup=True, highlight=False)
        raise typer.Exit(ExitCode.HARNESS) from None
    except KbvError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}", markup=True, highlight=False)  # [ray] is not markup
        raise typer.Exit(ExitCode.BAD_INPUT) from None
    except KeyboardInterrupt:
        err.print("interrupted: every verdict finished so far is stored; re-run the command to resume")
        raise typer.Exit(ExitCode.INTERRUPTED) from None
    except Exception as exc:  # a bug in kbv: say so in one line; KBV_DEBUG=1 shows the traceback
        if os.environ.get("KBV_DEBUG"):
            raise
        err.print(f"[red]kbv failed (a bug in kbv, not in your input):[/] {type(exc).__name__}: {exc}. "
                  "Verdicts finished so far are stored; set KBV_DEBUG=1 for the traceback.", highlight=False)
        raise typer.Exit(ExitCode.HARNESS) from None


@app.command("eval")
def eval_command(
    candidates: str = typer.Argument(..., help="A candidate .py file, a directory of them, a KernelBench run directory, or a .jsonl file."),
    problems: str = typer.Option("smoke", "--problems", "-p", help="A problem .py file, a directory tree (level1/...), a .parquet file, or a bundled suite: smoke, full."),
    protocol: str = typer.Option("standard", help="standard (KernelBench's), verified, or both."),
    device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N."),
    devices: Optional[str] = typer.Option(None, help="One evaluation lane per device: auto (every GPU), GPU indices (0,1,3), or CPU lanes (cpu,cpu)."),
    pairs_per_device: int = typer.Option(1, help="Pairs each device evaluates at once: their untimed work overlaps, their timed windows take turns (1-8)."),
    executor: str = typer.Option("local", help="local (this machine) or ray (a Ray cluster: one task per pair)."),
    ray_address: Optional[str] = typer.Option(None, help="--executor ray: auto, HOST:PORT or ray://HOST:PORT (default: a running local Ray, else a new one)."),
    run: Optional[str] = typer.Option(None, "--run", help="Run directory (results database); re-running resumes. Default: kbv-runs/<candidates name>."),
    seed: Optional[int] = typer.Option(None, help="Fix the verified protocol's secret seed (recorded)."),
    timeout: float = typer.Option(300.0, help="Wall-clock seconds for one pair's evaluation."),
    prepare_timeout: Optional[float] = typer.Option(None, help="Wall-clock seconds for preparing one problem under one protocol (default: --timeout); past it, a stored problem failure naming the step."),
    build_timeout: float = typer.Option(900.0, help="Wall-clock seconds for one candidate's build."),
    jobs: int = typer.Option(0, help="Parallel builds (0: one per CPU set apart for builds, as memory allows)."),
    build_isolation: str = typer.Option("auto", help="How builds keep out of timings: pin (cores apart, lowest priority), hold (stopped while a pair is timed), none, or auto."),
    pch: bool = typer.Option(True, "--pch/--no-pch", help="Builds share precompiled torch headers (the C++ bindings file only)."),
    tolerance: float = typer.Option(1e-2, help="Standard protocol atol = rtol (KernelBench v0.1: 1e-2; HEAD: 1e-4)."),
    standard_timing: str = typer.Option("cuda_event", help="Standard protocol timer, KernelBench's methods: cuda_event (its default), do_bench or host_time."),
    warm_clocks: bool = typer.Option(True, "--warm-clocks/--no-warm-clocks", help="Keep a GPU busy until its clocks are up before every timed window (both protocols)."),
    cache_dir: Optional[str] = typer.Option(None, help="Where builds are cached across runs (default $KBV_CACHE_DIR or ~/.cache/kbv)."),
    precision: str = typer.Option("tf32", help="Verified baseline precision: tf32 (realistic) or fp32 (strict)."),
    baseline: str = typer.Option("eager-tf32", help="Verified baselines to time, comma-separated: eager-tf32, eager-fp32, compile."),
    trials: int = typer.Option(2, help="Verified trials per hidden distribution."),
    ci_target: float = typer.Option(0.01, help="Verified timer: stop when each median's CI half-width is below this."),
    timer_budget: float = typer.Option(30.0, help="Verified timer: wall-clock seconds at most per pair."),
    min_custom_share: float = typer.Option(0.0, help="Verified: least share of device time in the candidate's own kernels (0-1)."),
    sandbox: str = typer.Option("auto", help="How children are isolated: auto (the strongest available, a warning when not full), strict (full isolation or fail at start), off (none: debugging only)."),
    output: str = typer.Option("table", "--format", help="table or json."),
) -> None:
    """Evaluate candidates against their problems."""
    from kbv.api import EvalConfig, evaluate

    config = EvalConfig(candidates=candidates, problems=problems, protocol=protocol, device=device,
                        devices=devices, pairs_per_device=pairs_per_device, executor=executor, ray_address=ray_address, run_dir=run, seed=seed, timeout_s=timeout, build_timeout_s=build_timeout,
                        prepare_timeout_s=prepare_timeout or 0.0, jobs=jobs, build_isolation=build_isolation, pch=pch,
                        tolerance=tolerance, standard_timing=standard_timing, warm_clocks=warm_clocks,
                        cache_dir=cache_dir, precision=precision,
                        baselines=tuple(b.strip() for b in baseline.split(",") if b.strip()),
                        trials=trials, ci_target=ci_target, timer_budget_s=timer_budget,
                        min_custom_share=min_custom_share, sandbox=sandbox)
    with _errors():
        _check_format(output, ("table", "json"))
        with _progress(output) as (progress, watch):
            result = evaluate(config, progress=progress, watch=watch, notice=_notice,
                              paired=lambda pairing: _print_unpaired(pairing, output))
    for f in result.problem_failures:
        err.print(f"[red]problem failed:[/] {f.message}", highlight=False)
    _render_run(result, output)
    if result.problem_failures:
        raise typer.Exit(ExitCode.PROBLEM_FAILURES)


UNPAIRED_SHOWN = 20  # unpaired candidates listed before a run; the rest are counted (all are in --format json)


def _print_unpaired(pairing: Any, output: str) -> None:
    """Each candidate that pairs with no problem, or with several, and why: before the run starts,
    where its progress goes (stdout for the table format, stderr for json)."""
    from kbv.candidates import unpaired_lines

    stream = sys.stdout if output == "table" else sys.stderr
    for line in unpaired_lines(pairing.unpaired, UNPAIRED_SHOWN):
        stream.write(f"unpaired: {line}\n")
    stream.flush()


def _notice(line: str, warning: bool) -> None:
    """The isolation a run's children get, on stderr before anything runs; loud when it is not full."""
    err.print(f"[yellow]warning:[/] {escape(line)}" if warning else escape(line), markup=True, highlight=False)


@app.command("serve")
def serve_command(
    problems: str = typer.Option("smoke", "--problems", "-p", help="The problems served: a .py file, a directory tree, a .parquet file, or a bundled suite (smoke, full)."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on. Anything beyond this machine needs --token-env."),
    port: int = typer.Option(8000, help="Port to listen on (0: a free one; the ready line says which)."),
    token_env: Optional[str] = typer.Option(None, help="An environment variable holding the bearer token every /v1 request must carry."),
    reward: str = typer.Option("kernelbench-rl", help="The reward rule: kernelbench-rl (0.3 + speedup), log-speedup (max(0.1, 1 + ln speedup)) or correct (1); 0 unless passed."),
    device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N."),
    devices: Optional[str] = typer.Option(None, help="One evaluation lane per device: auto (every GPU), GPU indices (0,1,3), or CPU lanes (cpu,cpu)."),
    pairs_per_device: int = typer.Option(1, help="Pairs each device evaluates at once: their untimed work overlaps, their timed windows take turns (1-8)."),
    executor: str = typer.Option("local", help="local (this machine) or ray (a Ray cluster: one task per pair)."),
    ray_address: Optional[str] = typer.Option(None, help="--executor ray: auto, HOST:PORT or ray://HOST:PORT."),
    run: str = typer.Option("kbv-runs/serve", "--run", help="Run directory: every verdict and answer goes to its database (kbv report reads it); a restart answers what it holds."),
    max_queue: int = typer.Option(4096, help="Pairs in flight at most; a request that would pass it gets 429."),
    max_batch: int = typer.Option(1024, help="Items in one /v1/evaluate_batch at most (413 beyond)."),
    max_code_bytes: int = typer.Option(1 << 20, help="Bytes of one item's code at most (413 beyond)."),
    max_body_bytes: int = typer.Option(64 << 20, help="Bytes of one request body at most (413 beyond)."),
    keep_problems: int = typer.Option(4, help="Prepared problems each lane keeps per protocol across requests."),
    drain_timeout: float = typer.Option(20.0, help="On SIGTERM, seconds the admitted pairs may still take before they are aborted."),
    seed: Optional[int] = typer.Option(None, help="Fix the verified protocol's secret seed (recorded)."),
    timeout: float = typer.Option(300.0, help="Wall-clock seconds for one pair's evaluation."),
    prepare_timeout: Optional[float] = typer.Option(None, help="Wall-clock seconds for preparing one problem under one protocol (default: --timeout); past it, a stored problem failure naming the step."),
    build_timeout: float = typer.Option(900.0, help="Wall-clock seconds for one candidate's build."),
    jobs: int = typer.Option(0, help="Parallel builds (0: one per core, at most 8)."),
    tolerance: float = typer.Option(1e-2, help="Standard protocol atol = rtol."),
    standard_timing: str = typer.Option("cuda_event", help="Standard protocol timer: cuda_event, do_bench or host_time."),
    cache_dir: Optional[str] = typer.Option(None, help="Where builds are cached (default $KBV_CACHE_DIR or ~/.cache/kbv)."),
    precision: str = typer.Option("tf32", help="Verified baseline precision: tf32 or fp32."),
    baseline: str = typer.Option("eager-tf32", help="Verified baselines to time, comma-separated: eager-tf32, eager-fp32, compile."),
    trials: int = typer.Option(2, help="Verified trials per hidden distribution."),
    ci_target: float = typer.Option(0.01, help="Verified timer: stop when each median's CI half-width is below this."),
    timer_budget: float = typer.Option(30.0, help="Verified timer: wall-clock seconds at most per pair."),
    min_custom_share: float = typer.Option(0.0, help="Verified: least share of device time in the candidate's own kernels (0-1)."),
    log_level: str = typer.Option("warning", help="uvicorn's log level: critical, error, warning, info or debug."),
    access_log: bool = typer.Option(False, help="Log every request (uvicorn's access log)."),
) -> None:
    """Serve verified rewards over HTTP: POST /v1/evaluate, /v1/evaluate_batch; GET /healthz."""
    from kbv.api import EvalConfig
    from kbv.serve.requests import Limits
    from kbv.serve.server import ServeConfig, serve

    evaluation = EvalConfig(candidates="serve", problems=problems, device=device, devices=devices,
                            pairs_per_device=pairs_per_device, executor=executor,
                            ray_address=ray_address, run_dir=run, seed=seed, timeout_s=timeout,
                            prepare_timeout_s=prepare_timeout or 0.0, build_timeout_s=build_timeout, jobs=jobs, tolerance=tolerance,
                            standard_timing=standard_timing, cache_dir=cache_dir,
                            precision=precision, baselines=tuple(b.strip() for b in baseline.split(",") if b.strip()),
                            trials=trials, ci_target=ci_target, timer_budget_s=timer_budget,
                            min_custom_share=min_custom_share, keep_problems=keep_problems)
    config = ServeConfig(evaluation=evaluation, host=host, port=port, token_env=token_env, reward=reward,
                         limits=Limits(max_code_bytes=max_code_bytes, max_batch=max_batch, max_queue=max_queue,
                                       max_body_bytes=max_body_bytes),
                         drain_timeout_s=drain_timeout, log_level=log_level, access_log=access_log)

    def ready(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    with _errors():
        result = serve(config, ready)
    note = f"; {result.aborted} pairs in flight were aborted (not stored)" if result.aborted else ""
    err.print(f"kbv serve: stopped{note}; every stored verdict is in {run}", highlight=False)
    if result.aborted:  # worker threads may still be inside a pair whose child was killed: do not wait
        from kbv.sandbox import kill_all_children

        kill_all_children()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(ExitCode.OK))


def _render_run(result: Any, output: str) -> None:
    from kbv.metrics import metrics_by_group
    from kbv.report import metrics_table, verdict_table

    metrics = metrics_by_group(result.verdicts)
    if output == "json":
        from dataclasses import asdict

        payload = {"run": str(result.run_dir), "verdicts": [v.to_dict() for v in result.verdicts],
                   "metrics": {p: {g: asdict(m) for g, m in gs.items()} for p, gs in metrics.items()},
                   "unpaired": [u.to_dict() for u in result.unpaired]}
        if result.stats is not None:
            payload["stats"] = {**asdict(result.stats), "pairs_per_min": round(result.stats.pairs_per_min, 2),
                                "busy_share": round(result.stats.busy_share, 3),
                                "floor_s": round(result.stats.floor_s, 2)}
        out.print_json(json.dumps(payload))
        return
    out.print(verdict_table(result.verdicts))
    out.print(metrics_table(metrics))
    _print_hacks(metrics, result.verdicts)
    out.print(f"run: {result.run_dir}  (evaluated {result.evaluated}, resumed {result.resumed}, "
              f"unpaired {len(result.unpaired)})", highlight=False)
    if result.stats is not None and result.stats.pairs:
        out.print(result.stats.describe(), highlight=False)


def _print_hacks(metrics: Any, verdicts: Any) -> None:
    """What verified took back (the pairs standard passes and verified rejects), then hacks by category."""
    from kbv.report import hacks_table, rejections_line

    line = rejections_line(verdicts)
    if line is not None:
        out.print(line, highlight=False)
    table = hacks_table(metrics)
    if table is not None:
        out.print(table)


REPORT_FORMATS = ("table", "json", "jsonl", "html", "csv", "parquet")


@app.command("report")
def report_command(
    runs: list[str] = typer.Argument(..., help="Run directories written by `kbv eval`; several make one report across them."),
    output: str = typer.Option("table", "--format", help="table, json, jsonl (printed), or html, csv, parquet (written to a file)."),
    out_file: Optional[str] = typer.Option(None, "--out", help="The file for html, csv or parquet. Default: report.html, verdicts.csv or verdicts.parquet in the first run."),
    by: str = typer.Option("pair", "--by", help="table: one row per pair, or one per model (the leaderboard)."),
) -> None:
    """Show runs' verdicts and metrics, or write them as an HTML report or a Parquet/CSV export."""
    from kbv.report.publish import FILE_FORMATS, write_report
    from kbv.report.runs import load_runs

    with _errors():
        _check_format(output, REPORT_FORMATS)
        _check_format(by, ("pair", "model"), option="--by")
        if output in FILE_FORMATS:
            written = write_report(runs, output, out_file)
        elif out_file is not None:
            from kbv.errors import UsageError

            raise UsageError(f"--out writes html, csv or parquet; --format {output} prints to stdout.")
        else:
            loaded = load_runs(runs)
    if output in FILE_FORMATS:
        err.print(f"{written.verdicts} verdicts from {written.runs} run{'s' * (written.runs != 1)}", highlight=False)
        sys.stdout.write(f"{written.path.resolve()}\n")
        return
    _render_report(loaded, output, by)


def _render_report(loaded: Any, output: str, by: str) -> None:
    from kbv.report import leaderboard_table, metrics_table, pass_at_k_table, problem_failures_table, verdict_table
    from kbv.report.leaderboard import leaderboard

    reports = [run.report for run in loaded.runs]
    if output == "json":
        payload = reports[0].to_dict() if len(reports) == 1 else {"runs": [r.to_dict() for r in reports]}
        sys.stdout.write(json.dumps(payload, indent=1) + "\n")
    elif output == "jsonl":
        for _, v in loaded.stored():
            sys.stdout.write(json.dumps(v.to_dict()) + "\n")
    elif by == "model":
        out.print(leaderboard_table(leaderboard(loaded.verdicts)))
    else:
        metrics = loaded.metrics()
        out.print(verdict_table(loaded.verdicts))
        out.print(metrics_table(metrics))
        _print_hacks(metrics, loaded.verdicts)
        failures = problem_failures_table(loaded.problem_failures())
        if failures is not None:
            out.print(failures)
        for report in reports:
            if report.pass_at_k:
                out.print(pass_at_k_table(report.pass_at_k))


@problems_app.command("list")
def problems_list(spec: str = typer.Argument("smoke", help="A path or a suite (smoke, full).")) -> None:
    """List problems with their level, id and content hash."""
    from rich.table import Table

    from kbv.problems import load_problems

    with _errors():
        problems = load_problems(spec)
    table = Table(title=f"{len(problems)} problems in {spec}", title_justify="left")
    for col in ("key", "level", "id", "hash", "origin"):
        table.add_column(col)
    for p in problems:
        table.add_row(p.key, str(p.level or "-"), str(p.problem_id if p.problem_id is not None else "-"),
                      p.hash[:12], p.origin)
    out.print(table)


@problems_app.command("check")
def problems_check(
    spec: str = typer.Argument("smoke", help="A path or a suite (smoke, full)."),
    device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N."),
    seed: Optional[int] = typer.Option(None, help="Fix the secret seed (default: random)."),
    all_rows: bool = typer.Option(False, "--all", help="List sound problems too."),
) -> None:
    """Screen problems: trivial candidates, input sensitivity, determinism, per hidden distribution."""
    from rich.table import Table

    from kbv.api import check_problems

    with _errors():
        reports = check_problems(spec, device=device, seed=seed)
    unsound = [r for r in reports if not r.sound]
    table = Table(title=f"{len(unsound)} of {len(reports)} problems unsound", title_justify="left")
    for col in ("problem", "distributions", "flags", "notes"):
        table.add_column(col, overflow="fold")
    for r in reports:
        if r.sound and not all_rows:
            continue
        dists = ", ".join(f"{d}={v or 'n/a'}" for d, v in r.calibration.items())
        table.add_row(r.problem, dists, "; ".join(r.flags) or "[green]sound[/]", "; ".join(r.notes))
    out.print(table)


def _check_format(value: str, allowed: tuple[str, ...], option: str = "format") -> None:
    from kbv.errors import UsageError

    if value not in allowed:
        raise UsageError(f"Unknown {option} '{value}': expected {', '.join(allowed)}.")


WAIT_LINE_S = 30.0  # off a terminal, a run that has stored no verdict for this long says why


@contextmanager
def _progress(output: str = "table") -> Iterator[tuple[Callable[[int, int, Any], None] | None, Any]]:
    """On a terminal, a progress bar (stderr) that says what the run waits on. Off one (logs, CI,
    nohup), one line per stored verdict, and one line when none has landed for WAIT_LINE_S (again
    each WAIT_LINE_S): on stdout for the table format, on stderr for machine formats (stdout stays
    parseable). Yields the `progress` and `watch` callbacks of `kbv.api.evaluate`."""
    if not sys.stdout.isatty():
        stream = sys.stdout if output == "table" else sys.stderr
        last_line = [0.0]

        def watch(state: Any, since_s: float) -> None:
            if since_s >= WAIT_LINE_S and since_s - last_line[0] >= WAIT_LINE_S:
                last_line[0] = since_s
                stream.write(f"[no verdict for {since_s:.0f} s] {state.describe()}\n")
                stream.flush()

        def progress(done: int, total: int, verdict: Any) -> None:
            last_line[0] = 0.0
            _progress_line(stream, done, total, verdict)

        yield progress, watch
        return
    if not err.is_terminal:
        yield None, None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as bar:
        task = bar.add_task("evaluating", total=None)

        def update(done: int, total: int, verdict: Any) -> None:
            from kbv.api import ProblemFailure

            desc = "evaluating" if verdict is None else f"{verdict.problem} problem failed" \
                if isinstance(verdict, ProblemFailure) else f"{verdict.problem} {verdict.status.value}"
            bar.update(task, completed=done, total=total, description=desc[:50])

        def waiting(state: Any, since_s: float) -> None:
            if since_s >= 2.0:  # a verdict's line stays up a moment
                width = max(40, err.width - 40)
                bar.update(task, description=escape(state.describe())[:width])

        yield update, waiting


def _progress_line(stream: Any, done: int, total: int, verdict: Any) -> None:
    """`[done/total] problem candidate protocol status speedup wall` for a verdict just stored;
    `[done/total] problem: problem failed: why` for a pair whose problem failed."""
    from kbv.api import ProblemFailure

    if verdict is None:
        return
    if isinstance(verdict, ProblemFailure):  # the pair has no verdict
        stream.write(f"[{done}/{total}] {verdict.problem}: problem failed: {verdict.message[:300]}\n")
        stream.flush()
        return
    from kbv.report.format import format_speedup

    speedup = format_speedup(verdict.speedup).replace(" ", "") if verdict.speedup is not None else "-"
    wall = verdict.evidence.get("pair_s", verdict.wall_s)
    head, tail = f"[{done}/{total}] {verdict.problem} ", f" {verdict.protocol} {verdict.status.value} {speedup} {wall:.1f}s"
    candidate = verdict.candidate
    width = int(os.environ["COLUMNS"]) if os.environ.get("COLUMNS", "").isdigit() else 0
    room = width - len(head) - len(tail)
    if width and len(candidate) > room >= 8:  # a narrow log keeps the line whole: the name is shortened in the middle
        candidate = candidate[: (room - 1) // 2] + "…" + candidate[len(candidate) - (room - 1 - (room - 1) // 2):]
    stream.write(head + candidate + tail + "\n")
    stream.flush()


def _interrupt(signum: int, frame: Any) -> None:
    """SIGTERM ends a run like Ctrl-C does."""
    raise KeyboardInterrupt


def main() -> None:
    # The parent's idle OpenMP workers must sleep, not spin: on a small machine spinning threads
    # steal the cores a child is being timed on (seen: a 10 us CPU kernel timed at 8 ms).
    # Must precede the first torch import, which every command does lazily.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import signal

    signal.signal(signal.SIGTERM, _interrupt)
    try:
        app()
    except SystemExit as exc:
        if exc.code == ExitCode.INTERRUPTED:
            # everything finished is stored: do not wait for worker threads still inside a pair the
            # interrupt cut short; a child one of them started since is killed too
            from kbv.sandbox import kill_all_children

            kill_all_children()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(int(ExitCode.INTERRUPTED))
        raise


if __name__ == "__main__":
    main()
