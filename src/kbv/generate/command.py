"""`kbv generate`: parse the options, build a GenerateConfig, call `generate`, render the summary.

Registered by the CLI with `app.command("generate")(generate_command)`. Exit status, as `kbv eval`'s:
0 the run finished (no_code and failed samples are results, not errors); 1 no request got a reply (they
are recorded all the same); 2 bad input (an option, a key, a problem file, a refusing endpoint); 3 kbv
itself failed. An error is printed as one line on stderr.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, NoReturn, Optional

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from kbv.errors import HarnessError, KbvError, UsageError
from kbv.generate.api import (
    DEFAULT_API_KEY_ENV,
    DEFAULT_BASE_URL,
    GenerateConfig,
    GenerateSummary,
    SamplingParams,
    generate,
)
from kbv.generate.client import RetryPolicy
from kbv.generate.prompts import Backend

_LOCAL_KEY_NOTE = "Unset is fine with --base-url and the default variable (a local server)."


def generate_command(
    problems: Annotated[str, typer.Option(
        "--problems", help="A suite (smoke, full) or a path: a problem .py file, a directory, a .parquet file.")],
    model: Annotated[str, typer.Option("--model", help="Model name, as the endpoint knows it.")],
    out: Annotated[Path, typer.Option(
        "--out", help="Output directory: KernelBench's run layout plus generations.jsonl (kbv eval reads it).")],
    base_url: Annotated[Optional[str], typer.Option(
        "--base-url", help=f"An OpenAI-compatible endpoint (vLLM, SGLang, Ollama, ...). Default: {DEFAULT_BASE_URL}.",
        show_default=False)] = None,
    api_key_env: Annotated[str, typer.Option(
        "--api-key-env", help=f"Environment variable holding the API key. {_LOCAL_KEY_NOTE}")] = DEFAULT_API_KEY_ENV,
    samples: Annotated[int, typer.Option("--samples", min=1, help="Samples per problem (pass@k needs several).")] = 1,
    temperature: Annotated[Optional[float], typer.Option(
        "--temperature", min=0.0, help="Sampling temperature. Default: not sent (the server's default).", show_default=False)] = None,
    max_tokens: Annotated[Optional[int], typer.Option(
        "--max-tokens", min=1, help="max_tokens of each reply. Default: not sent. For models that want "
        "max_completion_tokens, pass that with --extra-body.", show_default=False)] = None,
    backend: Annotated[Backend, typer.Option(
        "--backend", case_sensitive=False, help="What the kernels are to be written in (picks the template).")
    ] = Backend.CUDA,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="Requests in flight at once.")] = 8,
    prompt_template: Annotated[Optional[Path], typer.Option(
        "--prompt-template", help="Your own template ($problem_source, $problem_name) instead of the built-in one.",
        show_default=False)] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Neither read nor write the response cache.")] = False,
    request_timeout: Annotated[float, typer.Option(
        "--request-timeout", min=0.001, help="Seconds before one request is abandoned (then retried).")] = 600.0,
    max_retries: Annotated[int, typer.Option(
        "--max-retries", min=0, help="Retries on 429, 5xx, timeouts and connection errors.")] = 5,
    extra_body: Annotated[Optional[str], typer.Option(
        "--extra-body", help='JSON object merged into every request, e.g. \'{"reasoning_effort": "high"}\'.',
        show_default=False)] = None,
    cache_dir: Annotated[Optional[Path], typer.Option(
        "--cache-dir", help="Where the response cache lives. Default: $KBV_CACHE_DIR, else ~/.cache/kbv.",
        show_default=False)] = None,
) -> None:
    """Ask a model for a ModelNew per problem, one turn each, and write the answers for `kbv eval`."""
    try:
        config = GenerateConfig(
            problems=problems, model=model, out_dir=out, base_url=base_url or DEFAULT_BASE_URL,
            api_key_env=api_key_env, samples=samples,
            sampling=SamplingParams(temperature=temperature, max_tokens=max_tokens,
                                    extra_body=parse_extra_body(extra_body)),
            backend=backend, prompt_template=prompt_template, concurrency=concurrency,
            request_timeout_s=request_timeout, retry=RetryPolicy(max_retries=max_retries),
            use_cache=not no_cache, cache_dir=cache_dir)
        summary = generate_with_progress(config)
    except HarnessError as exc:
        _fail(f"kbv failed: {exc}", code=3)
    except KbvError as exc:  # a usage error, or a problem file that cannot be used
        _fail(str(exc), code=2)
    Console().print(summary_table(summary))
    if summary.generations and summary.request_failed == summary.generations:
        _fail(f"No request got a reply (first error: {summary.errors[0] if summary.errors else 'unknown'}).", code=1)


def parse_extra_body(text: str | None) -> dict[str, Any]:
    """The --extra-body JSON object ({} when not given). Raises UsageError for anything else."""
    if text is None or not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--extra-body is not valid JSON: {exc.msg} at column {exc.colno}.") from exc
    if not isinstance(value, dict):
        raise UsageError("--extra-body must be a JSON object, e.g. '{\"reasoning_effort\": \"high\"}'.")
    return value


def generate_with_progress(config: GenerateConfig) -> GenerateSummary:
    """`generate(config)` under a progress bar on stderr."""
    columns = (TextColumn("[bold]generate[/] {task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task(config.model, total=None)

        def on_progress(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        return generate(config, on_progress=on_progress)


def summary_table(summary: GenerateSummary) -> Table:
    """What the run did: samples by status, requests, cache hits, tokens, where the files are."""
    table = Table(title=f"kbv generate: {summary.model}", show_header=False, title_justify="left")
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")  # paths and error messages wrap, never lose their end
    rows = [
        ("samples", f"{summary.generations} ({summary.problems} problems)"),
        ("ok", str(summary.ok)),
        ("no code", str(summary.no_code)),
        ("request failed", str(summary.request_failed)),
        ("requests sent", str(summary.requests)),
        ("retries", str(summary.retries)),
        ("cache hits", str(summary.cache_hits)),
        ("tokens spent", f"{summary.prompt_tokens} prompt + {summary.completion_tokens} completion"),
        ("time", f"{summary.elapsed_s:.1f} s"),
        ("written", str(summary.jsonl_path)),
    ]
    rows += [("error", message) for message in summary.errors]
    for name, value in rows:
        table.add_row(name, value)
    return table


def _fail(message: str, code: int) -> NoReturn:
    Console(stderr=True, soft_wrap=True).print(f"error: {' '.join(message.split())}", markup=False, highlight=False)
    raise typer.Exit(code)
