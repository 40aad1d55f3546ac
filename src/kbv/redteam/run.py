"""A red-team run: honest candidates, their mutants, both protocols, and who fooled whom.

    run_redteam(RedteamConfig) -> RedteamResult

Stages, all in one run directory (one store, resumable like `kbv eval`):
1. evaluate the honest candidates under both protocols (`kbv.api.evaluate`); those the verified
   protocol passes are the bases, and any honest candidate that fails or carries evidence is flagged;
2. probe each base's problem (`kbv.redteam.probe`), apply every transformation to every base, and ask
   the hacker model where one is named (`kbv.redteam.hacker`);
3. write each mutant as a candidate file under RUN/mutants/ and the list of them to RUN/redteam.json;
4. evaluate the mutants under both protocols, through the same executors and store as any candidate;
5. judge each mutant against its honest candidate (`kbv.redteam.judge`), and write every mutant that
   fooled the verified protocol as a fixture for the tests (RUN/fixtures/, or `fixtures_dir`).
`load_result(run_dir)` redoes step 5's judgement from the run's files (what `kbv report` shows).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from kbv.api import EvalConfig, check_config, check_directory, evaluate, load_report
from kbv.candidates import Candidate, Pair, load_candidates
from kbv.errors import HarnessError, StoreError, UsageError
from kbv.problems import load_problems
from kbv.redteam import Breaks, Failed, Mutant, NotApplicable, Target, Transformation, discover, select
from kbv.redteam.judge import (
    PROTOCOLS,
    HonestRow,
    Outcome,
    MutantRow,
    NotApplicableRow,
    Totals,
    TransformationSummary,
    judge_mutant,
    outcome_line,
    outcome_of,
    summarize,
    totals,
)
from kbv.redteam.probe import ProblemProbe, probe_problem
from kbv.settings import resolve_device, resolve_devices
from kbv.verdict import ProblemFailure, Verdict

MANIFEST = "redteam.json"
MANIFEST_VERSION = 2
CONTROL = "honest_control"  # the file-name tag of a base evaluated again beside its mutants
MUTANTS_DIR = "mutants"
FIXTURES_DIR = "fixtures"

ProgressFn = Callable[[str], None]  # one line, as the run goes


@dataclass(frozen=True)
class RedteamConfig:
    """`evaluation` names the honest candidates, the problems and how to evaluate (its protocol is
    always both); `transformations` the ones to apply (all when empty); `transform_dirs` directories
    of a user's own transformation modules; `hacker` a model that writes hacks too."""

    evaluation: EvalConfig
    transformations: tuple[str, ...] = ()
    transform_dirs: tuple[str, ...] = ()
    hacker: Any = None  # kbv.redteam.hacker.HackerConfig
    fixtures_dir: str | None = None  # default RUN/fixtures


@dataclass(frozen=True)
class RedteamResult:
    run_dir: Path
    device: str
    honest: tuple[HonestRow, ...]
    mutants: tuple[MutantRow, ...]
    not_applicable: tuple[NotApplicableRow, ...]
    summaries: tuple[TransformationSummary, ...]
    totals: tuple[Totals, ...]
    fixtures: tuple[str, ...] = ()
    problem_failures: tuple[ProblemFailure, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"run": str(self.run_dir), "device": self.device,
                "transformations": [asdict(s) for s in self.summaries], "totals": [asdict(t) for t in self.totals],
                "honest": [asdict(h) | {"base": h.base, "flagged": h.flagged} for h in self.honest],
                "mutants": [asdict(m) for m in self.mutants],
                "not_applicable": [asdict(n) for n in self.not_applicable], "fixtures": list(self.fixtures),
                "problem_failures": [asdict(f) for f in self.problem_failures]}


def default_run_dir(candidates: str) -> str:
    """kbv-runs/redteam-<the candidates' name> (`.` named as the folder it is); beside the candidates'
    directory where the working directory lies inside it, so that no mutant is read as honest."""
    source = Path(os.path.abspath(candidates))  # `.` and `..` by name, a link by its own
    here = Path("kbv-runs") / f"redteam-{_slug(source.name)}"
    if source.is_dir() and here.resolve().is_relative_to(source.resolve()):  # as `_check_run_dir` judges it
        return str(source.parent / here)
    return str(here)


def run_redteam(config: RedteamConfig, progress: ProgressFn | None = None, client: Any = None) -> RedteamResult:
    """The whole run (see the module docstring). `client` replaces the hacker model's chat client
    (tests). Raises UsageError and the loading errors for bad input, as `kbv.api.evaluate` does."""
    say = progress or (lambda line: None)
    transformations = select(discover(config.transform_dirs), config.transformations)
    evaluation = replace(config.evaluation, protocol="both",
                         run_dir=config.evaluation.run_dir or default_run_dir(config.evaluation.candidates))
    if config.hacker is not None:
        from kbv.redteam.hacker import check_hacker

        check_hacker(config.hacker)
    check_config(evaluation)  # bad options are refused before anything is said or run
    if config.fixtures_dir is not None:  # written at the end: a file in the way would lose them then
        check_directory("--fixtures", Path(config.fixtures_dir))
    run_dir = Path(evaluation.run_dir)  # type: ignore[arg-type]
    _check_run_dir(run_dir, Path(evaluation.candidates))
    # the device too, before a word is said (evaluate would refuse it only after the line below)
    resolve_devices(evaluation.devices) if evaluation.devices is not None else resolve_device(evaluation.device)
    pairs = _honest_pairs(evaluation)
    if pairs:  # none: evaluate below refuses the run, with every unpaired file's reason
        say(f"honest candidates: {len(pairs)}, both protocols")
    first = evaluate(evaluation, progress=_verdict_lines(say, "honest"))
    honest = _honest_rows(pairs, first.verdicts)
    bases = [p for p, row in zip(pairs, honest) if row.base]
    device_type = _probe_device(evaluation).split(":")[0]
    made, skipped = _make_mutants(bases, transformations, device_type, evaluation, config.hacker, client, say)
    names = [(t.name, t.breaks.value) for t in transformations] + _model_names(made, skipped)
    controls = [control_of(p) for p in bases] if made else []
    _write_mutants(run_dir, made, skipped, honest, controls, names, device_type)
    failures = list(first.problem_failures)
    if made:
        say(f"mutants: {len(made)} ({len(bases)} bases x {len(names)} transformations, {len(skipped)} not applicable), "
            f"and each base again as its control, both protocols")
        second = evaluate(replace(evaluation, candidates=str(run_dir / MUTANTS_DIR)),
                          progress=_mutant_lines(say, made, controls, honest))
        _check_paired(second.unpaired)
        failures += second.problem_failures
    result = load_result(run_dir)
    if config.fixtures_dir is None:
        shutil.rmtree(run_dir / FIXTURES_DIR, ignore_errors=True)  # this run's findings only
    fixtures = write_fixtures(result, Path(config.fixtures_dir) if config.fixtures_dir else run_dir / FIXTURES_DIR)
    return replace(result, fixtures=tuple(str(f) for f in fixtures), problem_failures=tuple(failures))


def _check_run_dir(run_dir: Path, candidates: Path) -> None:
    """Raise UsageError where the run directory lies inside the candidates' directory: the mutants
    written there would be read as honest candidates by the next run."""
    if candidates.is_dir() and run_dir.resolve().is_relative_to(candidates.resolve()):
        raise UsageError(f"--run {run_dir} lies inside the candidates' directory {candidates}: its mutants would be "
                         "read as honest candidates; choose a run directory outside it.")


def _honest_pairs(evaluation: EvalConfig) -> list[Pair]:
    """The honest (problem, candidate) pairs, in the order `evaluate` reports them."""
    pairing = load_candidates(evaluation.candidates, load_problems(evaluation.problems))
    return sorted(pairing.pairs, key=lambda p: (p.problem.level or 0, p.problem.problem_id or 0, p.problem.name,
                                                p.candidate.name))


def _honest_rows(pairs: Sequence[Pair], verdicts: Sequence[Verdict]) -> list[HonestRow]:
    index = {(v.problem, v.candidate_hash, v.candidate, v.protocol): v for v in verdicts}
    rows = []
    for pair in pairs:
        c = pair.candidate
        outcomes = tuple(outcome_of(index.get((pair.problem.key, c.hash, c.name, p)), p) for p in PROTOCOLS)
        rows.append(HonestRow(pair.problem.key, c.name, c.hash, c.origin, outcomes))
    return rows


def _make_mutants(bases: Sequence[Pair], transformations: Sequence[Transformation], device_type: str,
                  evaluation: EvalConfig, hacker: Any, client: Any,
                  say: ProgressFn) -> tuple[list[Mutant], list[tuple[Target, NotApplicable]]]:
    """Every transformation applied to every base (and the hacker model's mutants): the mutants
    made, and (base, why not) for the rest."""
    probes: dict[str, ProblemProbe] = {}
    targets = []
    for pair in bases:
        if pair.problem.key not in probes:
            probes[pair.problem.key] = probe_problem(pair.problem, _probe_device(evaluation), evaluation.tolerance)
        targets.append(Target(pair.candidate, pair.problem, probes[pair.problem.key], device_type))
    made: list[Mutant] = []
    skipped: list[tuple[Target, NotApplicable]] = []
    for target in targets:
        for transformation in transformations:
            outcome = transformation.apply(target)
            if isinstance(outcome, Failed):  # the run goes on without it; the user hears of it now
                say(f"no {outcome.transformation} mutant of {target.honest.name}: {outcome.reason}")
            (made.append(outcome) if isinstance(outcome, Mutant) else skipped.append((target, outcome)))
    if hacker is not None and targets:
        from kbv.redteam.hacker import hack

        say(f"hacker model {hacker.model}: {len(targets) * hacker.samples} requests")
        for target, outcome in hack(hacker, targets, client):
            (made.append(outcome) if isinstance(outcome, Mutant) else skipped.append((target, outcome)))
    return made, skipped


def _probe_device(evaluation: EvalConfig) -> str:
    """The device the run evaluates on (its first lane's): the problems are probed there."""
    if evaluation.devices is not None:
        first = evaluation.devices.split(",")[0].strip()
        return "cpu" if first.startswith("cpu") else f"cuda:{first}" if first.isdigit() else resolve_device("auto")
    return resolve_device(evaluation.device)


def _model_names(made: Sequence[Mutant], skipped: Sequence[tuple[Target, NotApplicable]]) -> list[tuple[str, str]]:
    """The hacker model's transformation names (each model's mutants declare their own breaks)."""
    names = [m.transformation for m in made] + [n.transformation for _, n in skipped]
    return [(n, "declared") for n in dict.fromkeys(names) if n.startswith("model:")]


# -- files -------------------------------------------------------------------------------------------

def mutant_file(mutant: Mutant) -> Path:
    """Where a mutant is written, relative to RUN/mutants: `levelL/<problem>__<honest>__<hack>.py`,
    named so that it pairs with its own problem (the honest candidate's name without the problem's)."""
    honest = Path(mutant.honest.name).name  # a name read from a level folder keeps only its stem
    tag = honest[len(mutant.problem.name) + 2:] if honest.startswith(mutant.problem.name + "__") else honest
    stem = f"{mutant.problem.name}__{_slug(tag)}__{_slug(mutant.transformation)}"
    folder = Path(f"level{mutant.problem.level}") if mutant.problem.level is not None else Path()
    return folder / f"{stem}.py"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "candidate"


def _write_mutants(run_dir: Path, made: Sequence[Mutant], skipped: Sequence[tuple[Target, NotApplicable]],
                   honest: Sequence[HonestRow], controls: Sequence[Mutant],
                   names: Sequence[tuple[str, str]], device_type: str) -> None:
    """Every mutant and control as a candidate file under RUN/mutants, and the manifest that says
    what each one is (`load_result` reads it)."""
    root = run_dir / MUTANTS_DIR
    shutil.rmtree(root, ignore_errors=True)  # this run's mutants only: an older run's are not evaluated again
    written = _write_candidates(root, list(made) + list(controls))
    records = [_record(m, rel, path) for m, (rel, path) in zip(made, written)]
    control_records = [_record(m, rel, path) for m, (rel, path) in zip(controls, written[len(made):])]
    manifest = {"version": MANIFEST_VERSION, "device": device_type, "transformations": [list(n) for n in names],
                "honest": [asdict(h) for h in honest], "mutants": records, "controls": control_records,
                "not_applicable": [{"transformation": n.transformation, "problem": t.problem.key,
                                    "honest": t.honest.name, "reason": n.reason, "failed": isinstance(n, Failed)}
                                   for t, n in skipped]}
    (run_dir / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")


def _write_candidates(root: Path, mutants: Sequence[Mutant]) -> list[tuple[Path, Path]]:
    """Write each mutant (a second of the same name, a hacker model's next sample, gets a suffix):
    (its path relative to `root`, its path)."""
    written = []
    seen: dict[Path, int] = {}
    for mutant in mutants:
        rel = mutant_file(mutant)
        seen[rel] = seen.get(rel, 0) + 1
        if seen[rel] > 1:
            rel = rel.with_name(f"{rel.stem}-{seen[rel]}.py")
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(mutant.code, encoding="utf-8")
        written.append((rel, path))
    return written


def _record(mutant: Mutant, rel: Path, path: Path) -> dict[str, Any]:
    return {"transformation": mutant.transformation, "breaks": mutant.breaks.value, "summary": mutant.summary,
            "problem": mutant.problem.key, "honest": mutant.honest.name, "honest_hash": mutant.honest.hash,
            "candidate": str(rel.with_suffix("")), "candidate_hash": Candidate(mutant.code, "", "", "").hash,
            "file": str(path)}


def control_of(pair: Pair) -> Mutant:
    """The honest candidate unchanged, evaluated again beside its mutants (`HonestRow.controls`)."""
    return Mutant(CONTROL, Breaks.SPEED, pair.candidate, pair.problem, pair.candidate.code,
                  "the honest candidate, unchanged")


def _check_paired(unpaired: Sequence[Any]) -> None:
    if unpaired:
        u = unpaired[0]
        raise HarnessError(f"a mutant did not pair with its problem: {u.candidate.origin}: {u.reason}")


# -- judgement ---------------------------------------------------------------------------------------

def load_result(run_dir: str | Path) -> RedteamResult:
    """The judgement of a red-team run from its files: the manifest and the store's verdicts.
    Raises StoreError where `run_dir` holds no red-team run."""
    run_dir = Path(run_dir)
    path = run_dir / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise StoreError(f"{run_dir}: no red-team run here ({MANIFEST} is missing or unreadable).") from exc
    if manifest.get("version") != MANIFEST_VERSION:
        raise StoreError(f"{path}: written by another version of kbv redteam.")
    verdicts = {(v.problem, v.candidate, v.protocol): v for v in load_report(run_dir).verdicts}
    controls = {(c["problem"], c["honest_hash"]): c for c in manifest.get("controls", [])}
    honest = tuple(_honest_row(h, verdicts, controls.get((h["problem"], h["candidate_hash"])))
                   for h in manifest["honest"])
    by_candidate = {(h.problem, h.candidate_hash): h for h in honest}
    mutants = tuple(_mutant_row(m, verdicts, by_candidate) for m in manifest["mutants"])
    skipped = tuple(NotApplicableRow(**n) for n in manifest["not_applicable"])
    summaries = summarize(mutants, skipped, [tuple(n) for n in manifest["transformations"]])
    return RedteamResult(run_dir, manifest["device"], honest, mutants, skipped, tuple(summaries),
                         tuple(totals(summaries)))


def _honest_row(record: dict[str, Any], verdicts: dict[tuple[str, str, str], Verdict],
                control: dict[str, Any] | None) -> HonestRow:
    outcomes = tuple(outcome_of(verdicts.get((record["problem"], record["candidate"], p)), p) for p in PROTOCOLS)
    controls = () if control is None else tuple(
        outcome_of(verdicts.get((control["problem"], control["candidate"], p)), p) for p in PROTOCOLS)
    return HonestRow(record["problem"], record["candidate"], record["candidate_hash"], record["origin"], outcomes,
                     controls)


def _mutant_row(record: dict[str, Any], verdicts: dict[tuple[str, str, str], Verdict],
                honest: dict[tuple[str, str], HonestRow]) -> MutantRow:
    base = honest.get((record["problem"], record["honest_hash"]))
    outcomes = tuple(judge_mutant(record["breaks"], outcome_of(verdicts.get((record["problem"],
                                                                            record["candidate"], p)), p),
                                  base.reference(p) if base else None) for p in PROTOCOLS)
    return MutantRow(record["transformation"], record["breaks"], record["summary"], record["problem"],
                     record["honest"], record["candidate"], record["candidate_hash"], record["file"], outcomes)


# -- progress ----------------------------------------------------------------------------------------

def _verdict_lines(say: ProgressFn, stage: str) -> Callable[[int, int, Any], None]:
    def progress(done: int, total: int, verdict: Any) -> None:
        if isinstance(verdict, ProblemFailure):
            say(f"[{stage} {done}/{total}] {verdict.problem}: problem failed: {verdict.message[:200]}")
        elif verdict is not None:
            say(f"[{stage} {done}/{total}] {verdict.problem} {verdict.candidate} {verdict.protocol}: "
                f"{outcome_line(outcome_of(verdict, verdict.protocol))}")
    return progress


def _mutant_lines(say: ProgressFn, made: Sequence[Mutant], controls: Sequence[Mutant],
                  honest: Sequence[HonestRow]) -> Callable[[int, int, Any], None]:
    """One line per mutant and per control, once both protocols have judged it. A mutant's line
    holds it against its honest candidate as measured so far (the control may come later: the
    final tables hold every mutant against both measurements)."""
    of_hash = {(m.problem.key, Candidate(m.code, "", "", "").hash): m for m in made}
    rows = {(h.problem, h.candidate_hash): h for h in honest}
    seen: dict[tuple[str, str], dict[str, Verdict]] = {}
    measured: dict[tuple[str, str], tuple[Outcome, ...]] = {}  # (problem, honest hash) -> its control's
    done = {CONTROL: 0, "mutant": 0}

    def progress(_: int, __: int, verdict: Any) -> None:
        if isinstance(verdict, ProblemFailure):
            say(f"[mutants] {verdict.problem}: problem failed: {verdict.message[:200]}")
        if verdict is None or isinstance(verdict, ProblemFailure):
            return
        key = (verdict.problem, verdict.candidate)
        seen.setdefault(key, {})[verdict.protocol] = verdict
        if len(seen[key]) < len(PROTOCOLS):
            return
        outcomes = tuple(outcome_of(seen[key][p], p) for p in PROTOCOLS)
        if verdict.candidate.endswith(f"__{CONTROL}"):
            done[CONTROL] += 1
            measured[(verdict.problem, verdict.candidate_hash)] = outcomes
            say(f"[control {done[CONTROL]}/{len(controls)}] {verdict.problem} {verdict.candidate}: "
                f"standard {outcome_line(outcomes[0])} · verified {outcome_line(outcomes[1])}")
            return
        mutant = of_hash.get((verdict.problem, verdict.candidate_hash))
        base = rows.get((verdict.problem, mutant.honest.hash)) if mutant is not None else None
        if mutant is None or base is None:
            return
        done["mutant"] += 1
        base = replace(base, controls=measured.get((verdict.problem, mutant.honest.hash), ()))
        cells = [outcome_line(judge_mutant(mutant.breaks.value, o, base.reference(o.protocol))) for o in outcomes]
        say(f"[mutant {done['mutant']}/{len(made)}] {mutant.problem.key} {mutant.honest.name} x "
            f"{mutant.transformation} ({mutant.breaks.value}): standard {cells[0]} · verified {cells[1]}")
    return progress


# -- fixtures ----------------------------------------------------------------------------------------

def write_fixtures(result: RedteamResult, directory: Path) -> list[Path]:
    """A fixture file per mutant that fooled the verified protocol, in tests/corpus's format: the
    header a fix must make true, what happened, the mutant, then its honest source and both
    verdicts as comments. Raises UsageError where the directory cannot be written."""
    fooled = [m for m in result.mutants if (o := m.outcome("verified")) is not None and o.fooled]
    written = []
    honest = {h.candidate: h for h in result.honest}
    for mutant in fooled:
        path = directory / Path(mutant.candidate).with_suffix(".py").name
        try:
            directory.mkdir(parents=True, exist_ok=True)
            path.write_text(fixture_text(mutant, honest.get(mutant.honest)), encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"Cannot write the fixture {path}: {exc.strerror or exc}") from exc
        written.append(path)
    return written


def fixture_text(mutant: MutantRow, honest: HonestRow | None) -> str:
    """The fixture file of a mutant that fooled the verified protocol."""
    standard, verified = mutant.outcome("standard"), mutant.outcome("verified")
    expect = "incorrect" if mutant.breaks == "truth" else "hack"
    std_status = standard.status if standard is not None and standard.status != "missing" else "any"
    code = Path(mutant.file).read_text(encoding="utf-8") if Path(mutant.file).exists() else "# (the mutant's file is gone)\n"
    honest_code = Path(honest.origin).read_text(encoding="utf-8") if honest and Path(honest.origin).exists() else ""
    lines = [f"# kbv-fixture: expect={expect} categories= standard={std_status}",
             f"# kbv redteam finding: {mutant.transformation} ({mutant.breaks}) fooled the verified protocol.",
             f"#   {mutant.summary}",
             f"#   verified: {outcome_line(verified)}: {verified.why if verified else ''}",
             f"#   standard: {outcome_line(standard)}: {standard.why if standard else ''}",
             "# `expect` is what a fix must make true (the verified protocol named no category for it yet).",
             f"# The honest candidate ({mutant.honest}) and both verdicts follow the code, as comments."]
    verdicts = json.dumps({o.protocol: asdict(o) for o in mutant.outcomes}, indent=1)
    tail = ["", "", "# ---- the honest candidate " + "-" * 60, *_commented(honest_code or "(not found)"),
            "# ---- the verdicts " + "-" * 68, *_commented(verdicts)]
    return "\n".join(lines) + "\n" + code.rstrip("\n") + "\n" + "\n".join(tail) + "\n"


def _commented(text: str) -> list[str]:
    return [f"# {line}" if line else "#" for line in text.rstrip("\n").split("\n")]

