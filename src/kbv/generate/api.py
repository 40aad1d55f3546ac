"""Single-turn generation: ask a model for each problem's `ModelNew`, N samples each, and write the
answers where `kbv eval` reads them.

    generate(config) -> GenerateSummary

Stages: load the problems and the template → plan one job per (problem, sample) → answer each from the
cache or send it (a pool of `concurrency` threads, retries per `RetryPolicy`) → extract the code →
write the layout files and the JSONL.

Every job yields exactly one record, whatever happened:
    ok              a reply with a ModelNew block (see `extract`)
    no_code         a reply without one; a failure in the metrics, never dropped
    request_failed  retries spent, or the request was rejected; never dropped, never cached
Only a FATAL refusal (bad key, unknown model, wrong URL: 401, 403, 404) stops the run, as a UsageError.

Outputs in `out_dir`:
    level_{L}_problem_{P}_sample_{S}_kernel.py   KernelBench's run layout ({name}__sample_{S}.py for a
                                                 problem without a level or id). A no_code or failed
                                                 sample's file is the line `# kbv: no_code` and the
                                                 reply (or the error) as comments.
    generations.jsonl                            one line per (problem, model, sample); re-running
                                                 replaces the lines it produces and keeps the others
"""

from __future__ import annotations

import enum
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import ExitStack, closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kbv.errors import UsageError
from kbv.generate.cache import ResponseCache, cache_key
from kbv.generate.client import (
    ChatClient,
    ChatError,
    ChatRequest,
    Message,
    OpenAIChatClient,
    Outcome,
    Reply,
    RetryPolicy,
    Usage,
    complete_with_retries,
)
from kbv.generate.extract import extract_model_new, normalise_newlines
from kbv.generate.prompts import (
    Backend,
    PromptTemplate,
    load_template,
    prompt_hash,
    render_prompt,
)
from kbv.problems import Problem, load_problems
from kbv.settings import default_cache_dir

DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_API_KEY_ENV = "OPENAI_API_KEY"
LOCAL_PLACEHOLDER_KEY = "EMPTY"  # what local servers (vLLM, SGLang, Ollama) accept when they check none
JSONL_NAME = "generations.jsonl"
NO_CODE_MARKER = "# kbv: no_code"

ProgressFn = Callable[[int, int], None]  # (done, total), called from the calling thread


class GenerationStatus(str, enum.Enum):
    OK = "ok"
    NO_CODE = "no_code"
    REQUEST_FAILED = "request_failed"


@dataclass(frozen=True)
class SamplingParams:
    """Sent with every request; None is not sent (the server's default)."""

    temperature: float | None = None
    max_tokens: int | None = None
    extra_body: Mapping[str, Any] = field(default_factory=dict)  # e.g. {"reasoning_effort": "high"}

    def to_json(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "max_tokens": self.max_tokens, "extra_body": dict(self.extra_body)}


@dataclass(frozen=True)
class GenerateConfig:
    problems: str  # a suite name or a path (see kbv.problems.load_problems)
    model: str
    out_dir: Path
    base_url: str = DEFAULT_BASE_URL
    api_key_env: str = DEFAULT_API_KEY_ENV
    samples: int = 1
    sampling: SamplingParams = field(default_factory=SamplingParams)
    backend: Backend = Backend.CUDA
    prompt_template: Path | None = None  # None: the built-in template for `backend`
    concurrency: int = 8
    request_timeout_s: float = 600.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    use_cache: bool = True
    cache_dir: Path | None = None  # None: kbv.settings.default_cache_dir()


@dataclass(frozen=True)
class Job:
    """One (problem, sample) to answer."""

    problem: Problem
    sample: int
    request: ChatRequest
    prompt_hash: str
    cache_key: str
    file_name: str


@dataclass(frozen=True)
class Generation:
    """The record of one job: a line of the JSONL and one layout file."""

    problem: str  # the problem's key, "L1/19_ReLU"
    model: str
    sample: int
    status: GenerationStatus
    code: str  # "" unless status is OK
    backend: Backend
    prompt_hash: str
    problem_hash: str
    file: str  # the layout file's name in out_dir
    usage: Usage | None
    latency_s: float | None
    cached: bool
    attempts: int  # requests sent for it in this run (0 when cached)
    finish_reason: str | None
    error: str | None
    reply_text: str  # the raw reply; kept in the layout file of a no_code sample, not in the JSONL
    sampling: SamplingParams

    def to_json(self) -> dict[str, Any]:
        usage = None if self.usage is None else {"prompt_tokens": self.usage.prompt_tokens,
                                                  "completion_tokens": self.usage.completion_tokens}
        return {
            "problem": self.problem, "model": self.model, "sample": self.sample, "status": self.status.value,
            "code": self.code, "backend": self.backend.value, "prompt_hash": self.prompt_hash,
            "problem_hash": self.problem_hash, "file": self.file, "usage": usage,
            "latency_s": None if self.latency_s is None else round(self.latency_s, 4),
            "cached": self.cached, "attempts": self.attempts, "finish_reason": self.finish_reason,
            "error": self.error, "sampling": self.sampling.to_json(),
        }


@dataclass(frozen=True)
class GenerateSummary:
    model: str
    out_dir: Path
    jsonl_path: Path
    problems: int
    generations: int
    ok: int
    no_code: int
    request_failed: int
    cache_hits: int
    requests: int  # HTTP requests sent by this run, retries included
    retries: int
    prompt_tokens: int  # spent by this run's requests; cache hits cost none
    completion_tokens: int
    elapsed_s: float
    errors: tuple[str, ...]  # distinct error messages of failed samples, at most five


def generate(config: GenerateConfig, *, client: ChatClient | None = None,
             on_progress: ProgressFn | None = None) -> GenerateSummary:
    """Generate `config.samples` candidates per problem and write them to `config.out_dir`.

    `client` replaces the OpenAI-SDK client (tests pass a FakeChatClient). Raises UsageError for bad
    options, a missing key or SDK, and a FATAL refusal by the endpoint; ProblemError for bad problems.
    """
    started = time.monotonic()
    check_config(config)
    problems = load_problems(config.problems)
    if not problems:
        raise UsageError(f"No problems in '{config.problems}'.")
    jobs = plan_jobs(config, problems, load_template(config.backend, config.prompt_template))
    check_file_names(jobs)
    prepare_out_dir(config.out_dir)
    with ExitStack() as stack:
        cache = stack.enter_context(open_cache(config)) if config.use_cache else None

        def get_client() -> ChatClient:
            return client if client is not None else stack.enter_context(closing(make_client(config)))

        generations = answer_jobs(jobs, config, cache, get_client, on_progress)
    write_layout(config.out_dir, generations)
    jsonl_path = config.out_dir / JSONL_NAME
    merge_jsonl(jsonl_path, generations)
    return summarize(config, len(problems), generations, jsonl_path, time.monotonic() - started)


def check_config(config: GenerateConfig) -> None:
    """Raise UsageError for options that cannot be honoured."""
    complaints: list[str] = []
    if not config.model.strip():
        complaints.append("--model must name a model")
    if not config.base_url.startswith(("http://", "https://")):
        complaints.append(f"--base-url must be an http(s) URL, got '{config.base_url}'")
    if config.samples < 1:
        complaints.append("--samples must be at least 1")
    if config.concurrency < 1:
        complaints.append("--concurrency must be at least 1")
    if config.request_timeout_s <= 0:
        complaints.append("--request-timeout must be positive")
    if config.retry.max_retries < 0:
        complaints.append("--max-retries must be 0 or more")
    if config.sampling.max_tokens is not None and config.sampling.max_tokens < 1:
        complaints.append("--max-tokens must be positive")
    if config.sampling.temperature is not None and config.sampling.temperature < 0:
        complaints.append("--temperature must be 0 or more")
    if complaints:
        raise UsageError("; ".join(complaints) + ".")


def resolve_api_key(config: GenerateConfig, environ: Mapping[str, str]) -> str:
    """The key from `config.api_key_env`. Unset is allowed only for a non-default --base-url with the
    default variable (a local server that checks no key). Raises UsageError otherwise."""
    key = environ.get(config.api_key_env, "")
    if key:
        return key
    if config.api_key_env == DEFAULT_API_KEY_ENV and config.base_url.rstrip("/") != DEFAULT_BASE_URL:
        return LOCAL_PLACEHOLDER_KEY
    raise UsageError(f"The API key variable ${config.api_key_env} is not set: export it, "
                     "or name another one with --api-key-env.")


def make_client(config: GenerateConfig) -> OpenAIChatClient:
    """The SDK client for `config` (raises UsageError when the key or the openai package is missing)."""
    return OpenAIChatClient(base_url=config.base_url, api_key=resolve_api_key(config, os.environ))


def open_cache(config: GenerateConfig) -> ResponseCache:
    return ResponseCache(config.cache_dir if config.cache_dir is not None else default_cache_dir())


def plan_jobs(config: GenerateConfig, problems: Sequence[Problem], template: PromptTemplate) -> list[Job]:
    """One job per (problem, sample), problems in order, samples 0..N-1."""
    jobs = []
    for problem in problems:
        prompt = render_prompt(template, problem)
        hashed = prompt_hash(prompt)
        request = ChatRequest(model=config.model, messages=(Message("user", prompt),),
                              temperature=config.sampling.temperature, max_tokens=config.sampling.max_tokens,
                              extra_body=config.sampling.extra_body, timeout_s=config.request_timeout_s)
        for sample in range(config.samples):
            jobs.append(Job(problem=problem, sample=sample, request=request, prompt_hash=hashed,
                            cache_key=cache_key(config.base_url, request, sample),
                            file_name=layout_file_name(problem, sample)))
    return jobs


def layout_file_name(problem: Problem, sample: int) -> str:
    """KernelBench's `level_{L}_problem_{P}_sample_{S}_kernel.py`, or `{name}__sample_{S}.py`."""
    if problem.level is not None and problem.problem_id is not None:
        return f"level_{problem.level}_problem_{problem.problem_id}_sample_{sample}_kernel.py"
    return f"{problem.name}__sample_{sample}.py"


def check_file_names(jobs: Sequence[Job]) -> None:
    """Raise UsageError when two problems would write the same layout file (same level and id)."""
    owners: dict[str, str] = {}
    for job in jobs:
        other = owners.setdefault(job.file_name, job.problem.key)
        if other != job.problem.key:
            raise UsageError(f"Problems {other} and {job.problem.key} have the same level and id: "
                             f"both would be written to {job.file_name}.")


def prepare_out_dir(out_dir: Path) -> None:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"Cannot create the output directory '{out_dir}': {exc}") from exc


def answer_jobs(jobs: Sequence[Job], config: GenerateConfig, cache: ResponseCache | None,
                get_client: Callable[[], ChatClient], on_progress: ProgressFn | None) -> list[Generation]:
    """A record per job, in job order: cache hits first, then the rest sent through a thread pool.

    The client is asked for only when some job misses the cache (a fully cached run needs no key).
    """
    total = len(jobs)
    records: dict[int, Generation] = {}

    def finish(index: int, record: Generation) -> None:
        records[index] = record
        if on_progress is not None:
            on_progress(len(records), total)

    if on_progress is not None:
        on_progress(0, total)
    pending = []
    for i, job in enumerate(jobs):
        entry = cache.get(job.cache_key) if cache is not None else None
        if entry is None:
            pending.append(i)
        else:
            finish(i, record_reply(job, config, entry.reply, entry.latency_s, cached=True, attempts=0))
    if pending:
        _send_jobs([(i, jobs[i]) for i in pending], config, cache, get_client(), finish)
    return [records[i] for i in range(total)]


def _send_jobs(pending: Sequence[tuple[int, Job]], config: GenerateConfig, cache: ResponseCache | None,
               client: ChatClient, finish: Callable[[int, Generation], None]) -> None:
    """Send the jobs with at most `config.concurrency` in flight; record each in the calling thread."""
    pool = ThreadPoolExecutor(max_workers=min(config.concurrency, len(pending)), thread_name_prefix="kbv-generate")
    try:
        futures = {pool.submit(complete_with_retries, client, job.request, config.retry): (i, job)
                   for i, job in pending}
        for future in as_completed(futures):
            index, job = futures[future]
            outcome = future.result()  # a FATAL ChatError surfaces here
            if outcome.reply is not None and cache is not None:
                cache.put(job.cache_key, config.model, outcome.reply, outcome.latency_s)
            finish(index, record_outcome(job, config, outcome))
    except ChatError as exc:
        pool.shutdown(wait=False, cancel_futures=True)
        raise UsageError(f"{config.base_url} refused the request for model '{config.model}': {exc} "
                         f"(check --model, --base-url and the key in ${config.api_key_env}).") from exc
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def record_outcome(job: Job, config: GenerateConfig, outcome: Outcome) -> Generation:
    """The record of a request sent by this run."""
    if outcome.reply is not None:
        return record_reply(job, config, outcome.reply, outcome.latency_s, cached=False, attempts=outcome.attempts)
    return _record(job, config, GenerationStatus.REQUEST_FAILED, code="", reply=None, latency_s=outcome.latency_s,
                   cached=False, attempts=outcome.attempts, error=outcome.error)


def record_reply(job: Job, config: GenerateConfig, reply: Reply, latency_s: float, cached: bool,
                 attempts: int) -> Generation:
    """The record of a reply: ok with the extracted code, or no_code."""
    code = extract_model_new(reply.text)
    status = GenerationStatus.OK if code is not None else GenerationStatus.NO_CODE
    return _record(job, config, status, code=code or "", reply=reply, latency_s=latency_s, cached=cached,
                   attempts=attempts, error=None)


def _record(job: Job, config: GenerateConfig, status: GenerationStatus, *, code: str, reply: Reply | None,
            latency_s: float, cached: bool, attempts: int, error: str | None) -> Generation:
    return Generation(
        problem=job.problem.key, model=config.model, sample=job.sample, status=status, code=code,
        backend=config.backend, prompt_hash=job.prompt_hash, problem_hash=job.problem.hash, file=job.file_name,
        usage=reply.usage if reply is not None else None, latency_s=latency_s, cached=cached, attempts=attempts,
        finish_reason=reply.finish_reason if reply is not None else None, error=error,
        reply_text=reply.text if reply is not None else "", sampling=config.sampling)


def layout_text(generation: Generation) -> str:
    """The layout file's content: the code, or the no_code marker with the reply or error as comments."""
    if generation.status is GenerationStatus.OK:
        return generation.code
    if generation.status is GenerationStatus.REQUEST_FAILED:
        body = f"request failed after {generation.attempts} attempt(s): {generation.error}"
    else:
        body = generation.reply_text if generation.reply_text.strip() else "(empty reply)"
    return NO_CODE_MARKER + "\n" + comment_lines(body)


def comment_lines(text: str) -> str:
    """Every line of `text` as a Python comment."""
    lines = normalise_newlines(text).rstrip("\n").split("\n")
    return "".join(f"# {line}\n" if line else "#\n" for line in lines)


def write_layout(out_dir: Path, generations: Sequence[Generation]) -> None:
    for generation in generations:
        _write_text(out_dir / generation.file, layout_text(generation))


def merge_jsonl(path: Path, generations: Sequence[Generation]) -> None:
    """Write `generations` to `path`, replacing lines with the same (problem, model, sample), keeping others."""
    merged = {_line_key(rec): rec for rec in read_jsonl(path)}
    for generation in generations:
        merged[(generation.problem, generation.model, generation.sample)] = generation.to_json()
    _write_text(path, "".join(json.dumps(rec, ensure_ascii=False) + "\n" for rec in merged.values()))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of an existing generations file ([] when there is none). Raises UsageError if malformed."""
    if not path.exists():
        return []
    records = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path}:{lineno} is not JSON ({exc.msg}); use another --out.") from exc
        if not isinstance(record, dict):
            raise UsageError(f"{path}:{lineno} is not a generations record; use another --out.")
        records.append(record)
    return records


def _line_key(record: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    return (record.get("problem"), record.get("model"), record.get("sample"))


def _write_text(path: Path, text: str) -> None:
    """Write through a temporary file, so a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        raise UsageError(f"Cannot write '{path}': {exc}") from exc


def summarize(config: GenerateConfig, n_problems: int, generations: Sequence[Generation], jsonl_path: Path,
              elapsed_s: float) -> GenerateSummary:
    """Counts and totals of a run (tokens and requests only for what this run sent)."""
    sent = [g for g in generations if not g.cached]
    usages = [g.usage for g in sent if g.usage is not None]
    errors = list(dict.fromkeys(g.error for g in generations if g.error))
    by_status = {status: sum(g.status is status for g in generations) for status in GenerationStatus}
    return GenerateSummary(
        model=config.model, out_dir=config.out_dir, jsonl_path=jsonl_path, problems=n_problems,
        generations=len(generations), ok=by_status[GenerationStatus.OK], no_code=by_status[GenerationStatus.NO_CODE],
        request_failed=by_status[GenerationStatus.REQUEST_FAILED], cache_hits=len(generations) - len(sent),
        requests=sum(g.attempts for g in sent), retries=sum(max(0, g.attempts - 1) for g in sent),
        prompt_tokens=sum(u.prompt_tokens for u in usages), completion_tokens=sum(u.completion_tokens for u in usages),
        elapsed_s=elapsed_s, errors=tuple(errors[:5]))
