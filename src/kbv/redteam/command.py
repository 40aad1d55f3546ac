"""`kbv redteam CANDIDATES --problems ...`: honest candidates turned into known hacks, both protocols.

Registered by the CLI with `app.command("redteam")(redteam_command)`. Parse, build a RedteamConfig,
call `run_redteam`, render (tables or one JSON object), exit: 0 the run completed (whatever fooled
whom); 1 some problems' own code failed; 2 bad input (one line on stderr); 3 kbv itself failed;
130 interrupted (what finished is stored; the same command resumes). A line per verdict of the
honest candidates and one per mutant, as the run goes: on stdout for the table, on stderr for JSON.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any, NoReturn, Optional

import typer
from rich.console import Console
from rich.table import Table

_ERR = Console(stderr=True, soft_wrap=True)  # one message, one line: never wrapped
# Piped output is 160 wide unless COLUMNS says otherwise; the tables lay themselves out for the width.
_OUT = Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160)


def redteam_command(
    candidates: Annotated[Optional[str], typer.Argument(
        help="Honest candidates: a .py file, a directory of them (examples/), a KernelBench run directory, "
             "or a .jsonl file.", show_default=False)] = None,
    problems: Annotated[str, typer.Option("--problems", "-p", help="A .py file, a directory tree, a .parquet file, "
                                          "or a bundled suite (smoke, full).")] = "smoke",
    transforms: Annotated[Optional[str], typer.Option(
        "--transforms", help="The transformations to apply, comma-separated (default: all; --list names them).",
        show_default=False)] = None,
    transform_dir: Annotated[Optional[list[str]], typer.Option(
        "--transform-dir", help="A directory of your own transformation modules (*.py, each defining "
                                "TRANSFORMATION); may repeat.", show_default=False)] = None,
    list_only: Annotated[bool, typer.Option("--list", help="List the transformations and exit.")] = False,
    model: Annotated[Optional[str], typer.Option(
        "--model", help="Also ask this model to hack each honest candidate (kbv generate's client, any "
                        "OpenAI-compatible endpoint).", show_default=False)] = None,
    base_url: Annotated[Optional[str], typer.Option(
        "--base-url", help="The endpoint for --model. Default: OpenAI's.", show_default=False)] = None,
    api_key_env: Annotated[str, typer.Option("--api-key-env", help="Variable holding the key for --model.")
                           ] = "OPENAI_API_KEY",
    samples: Annotated[int, typer.Option("--samples", min=1, help="Hacks asked of --model per honest candidate.")] = 1,
    temperature: Annotated[Optional[float], typer.Option("--temperature", min=0.0, show_default=False,
                                                         help="--model's sampling temperature.")] = None,
    max_tokens: Annotated[Optional[int], typer.Option("--max-tokens", min=1, show_default=False,
                                                      help="max_tokens of each reply of --model.")] = None,
    extra_body: Annotated[Optional[str], typer.Option("--extra-body", show_default=False,
                                                      help="JSON object merged into every --model request.")] = None,
    request_timeout: Annotated[float, typer.Option("--request-timeout", min=0.001,
                                                   help="Seconds before a --model request is abandoned.")] = 600.0,
    max_retries: Annotated[int, typer.Option("--max-retries", min=0, help="Retries of a --model request.")] = 5,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Neither read nor write --model's response cache.")
                        ] = False,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")] = "auto",
    devices: Annotated[Optional[str], typer.Option(help="One lane per device: auto, GPU indices (0,1,3), or cpu,cpu.",
                                                   show_default=False)] = None,
    pairs_per_device: Annotated[int, typer.Option(
        "--pairs-per-device", help="Pairs each device evaluates at once: their untimed work overlaps, their timed "
                                   "windows take turns (1-8).")] = 1,
    run: Annotated[Optional[str], typer.Option("--run", help="Run directory (default kbv-runs/redteam-<candidates>); "
                                               "the same command resumes it.", show_default=False)] = None,
    fixtures: Annotated[Optional[str], typer.Option(
        "--fixtures", help="Where mutants that fool the verified protocol are written (default RUN/fixtures).",
        show_default=False)] = None,
    seed: Annotated[Optional[int], typer.Option(help="Fix the verified protocol's secret seed (recorded).")] = None,
    timeout: Annotated[float, typer.Option(help="Wall-clock seconds for one pair's evaluation.")] = 300.0,
    prepare_timeout: Annotated[Optional[float], typer.Option(
        help="Wall-clock seconds for preparing one problem under one protocol (default: --timeout); past it, a "
             "stored problem failure naming the step.", show_default=False)] = None,
    build_timeout: Annotated[float, typer.Option(help="Wall-clock seconds for one candidate's build.")] = 900.0,
    jobs: Annotated[int, typer.Option(help="Parallel builds (0: one per CPU set apart for builds).")] = 0,
    cache_dir: Annotated[Optional[str], typer.Option(help="Where builds (and --model's replies) are cached.",
                                                     show_default=False)] = None,
    tolerance: Annotated[float, typer.Option(help="Standard protocol atol = rtol.")] = 1e-2,
    standard_timing: Annotated[str, typer.Option(help="Standard protocol timer: cuda_event, do_bench or host_time.")
                               ] = "cuda_event",
    trials: Annotated[int, typer.Option(help="Verified trials per hidden distribution.")] = 2,
    ci_target: Annotated[float, typer.Option(help="Verified timer: stop when each median's CI half-width is below "
                                                  "this.")] = 0.01,
    timer_budget: Annotated[float, typer.Option(help="Verified timer: wall-clock seconds at most per pair.")] = 30.0,
    sandbox: Annotated[str, typer.Option(help="How children are isolated: auto, strict or off.")] = "auto",
    output: Annotated[str, typer.Option("--format", help="table or json.")] = "table",
) -> None:
    """Attack kbv with known hacks: mutants of honest candidates, evaluated under both protocols."""
    options = dict(locals())
    with _errors():
        _check_format(output)
        if list_only:
            _print_list(transform_dir or [])
            return
        result = _run(_config(options), output)
    _render(result, output)
    if result.problem_failures:
        raise typer.Exit(1)


@contextmanager
def _errors() -> Iterator[None]:
    """Bad input: one line on stderr, exit 2; kbv's own failure: one line, exit 3; an interrupt: 130
    (what finished is stored; the same command resumes). As `kbv eval` does (`kbv.cli`)."""
    from kbv.errors import HarnessError, KbvError

    try:
        yield
    except HarnessError as exc:
        _fail(f"kbv failed: {exc}", 3)
    except KbvError as exc:
        _fail(str(exc), 2)
    except KeyboardInterrupt:
        _ERR.print("interrupted: every verdict finished so far is stored; re-run the command to resume",
                   markup=False, highlight=False)
        raise typer.Exit(130) from None
    except Exception as exc:  # a bug in kbv: one line; KBV_DEBUG=1 shows the traceback
        if os.environ.get("KBV_DEBUG"):
            raise
        _fail(f"kbv failed (a bug in kbv, not in your input): {type(exc).__name__}: {exc}. "
              "Verdicts finished so far are stored; set KBV_DEBUG=1 for the traceback.", 3)


def _fail(message: str, code: int) -> NoReturn:
    _ERR.print(f"error: {' '.join(message.split())}" if code == 2 else " ".join(message.split()),
               markup=False, highlight=False)
    raise typer.Exit(code)


def _check_format(output: str) -> None:
    from kbv.errors import UsageError

    if output not in ("table", "json"):
        raise UsageError(f"Unknown format '{output}': expected table or json.")


def _config(opts: dict[str, Any]) -> Any:
    """The RedteamConfig of the command's options. Raises UsageError for bad ones."""
    from kbv.api import EvalConfig
    from kbv.errors import UsageError
    from kbv.redteam.run import RedteamConfig, default_run_dir

    if not opts["candidates"]:
        raise UsageError("Name the honest candidates: a .py file, a directory, a KernelBench run directory or a "
                         ".jsonl file (or --list the transformations).")
    evaluation = EvalConfig(
        candidates=opts["candidates"], problems=opts["problems"], protocol="both", device=opts["device"],
        devices=opts["devices"], pairs_per_device=opts["pairs_per_device"],
        run_dir=opts["run"] or default_run_dir(opts["candidates"]), seed=opts["seed"], timeout_s=opts["timeout"],
        prepare_timeout_s=opts["prepare_timeout"] or 0.0, build_timeout_s=opts["build_timeout"], jobs=opts["jobs"],
        cache_dir=opts["cache_dir"], tolerance=opts["tolerance"], standard_timing=opts["standard_timing"],
        trials=opts["trials"], ci_target=opts["ci_target"], timer_budget_s=opts["timer_budget"],
        sandbox=opts["sandbox"])
    names = tuple(n.strip() for n in (opts["transforms"] or "").split(",") if n.strip())
    if opts["transforms"] is not None and not names:  # an empty variable, say: never the whole run by accident
        raise UsageError(f"--transforms '{opts['transforms']}' names no transformation: name one or more "
                         "(--list shows them), or leave the option out for all of them.")
    return RedteamConfig(evaluation, names, tuple(opts["transform_dir"] or ()), _hacker(opts), opts["fixtures"])


def _hacker(opts: dict[str, Any]) -> Any:
    if opts["model"] is None:
        return None
    from pathlib import Path

    from kbv.generate.api import DEFAULT_BASE_URL, SamplingParams
    from kbv.generate.client import RetryPolicy
    from kbv.generate.command import parse_extra_body
    from kbv.redteam.hacker import HackerConfig

    return HackerConfig(model=opts["model"], base_url=opts["base_url"] or DEFAULT_BASE_URL,
                        api_key_env=opts["api_key_env"], samples=opts["samples"],
                        sampling=SamplingParams(opts["temperature"], opts["max_tokens"],
                                                parse_extra_body(opts["extra_body"])),
                        request_timeout_s=opts["request_timeout"], retry=RetryPolicy(max_retries=opts["max_retries"]),
                        use_cache=not opts["no_cache"], cache_dir=Path(opts["cache_dir"]) if opts["cache_dir"] else None)


def _run(config: Any, output: str) -> Any:
    from kbv.redteam.run import run_redteam

    stream = sys.stdout if output == "table" else sys.stderr

    def progress(line: str) -> None:
        stream.write(line + "\n")
        stream.flush()

    return run_redteam(config, progress)


def _render(result: Any, output: str) -> None:
    from kbv.report.redteam import attack_table, honest_table, mutant_table, not_applicable_table, totals_line

    if output == "json":
        sys.stdout.write(json.dumps(result.to_dict(), indent=1) + "\n")
        return
    _OUT.print(honest_table(result.honest))
    if result.mutants:
        _OUT.print(mutant_table(result.mutants))
    skipped = not_applicable_table(result.not_applicable)
    if skipped is not None:
        _OUT.print(skipped)
    _OUT.print(attack_table(result.summaries))
    _OUT.print(totals_line(result.totals), highlight=False)
    failed = sorted({n.transformation for n in result.not_applicable if n.failed})
    if failed:
        _OUT.print(f"transformations that failed (no mutant made; the reason is above): {', '.join(failed)}",
                   highlight=False)
    flagged = [h for h in result.honest if h.flagged]
    if flagged:
        _OUT.print(f"honest candidates flagged: {len(flagged)} ({', '.join(h.candidate for h in flagged)})",
                  highlight=False)
    for path in result.fixtures:
        _OUT.print(f"fixture (fooled the verified protocol): {path}", highlight=False)
    _OUT.print(f"run: {result.run_dir}  (kbv report {result.run_dir} --format html adds the red-team section)",
              highlight=False)


def _print_list(dirs: list[str]) -> None:
    from kbv.redteam import discover

    table = Table(title="Transformations", title_justify="left")
    for col in ("name", "breaks", "backends", "devices", "what the mutant does"):
        table.add_column(col, overflow="fold")
    for t in discover(dirs):
        table.add_row(t.name, t.breaks.value, ",".join(sorted(b.value for b in t.backends)),
                      ",".join(sorted(t.devices)), t.summary)
    _OUT.print(table)
