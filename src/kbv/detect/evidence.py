"""What a child's reports mean: integrity violations and hack evidence around one checked call, where
two runs over differently poisoned memory show the poison (`poison_shown`), and the state a candidate
holds after its construction (`retained_state`).

Pure functions of the reply records (`Child.op_forward` and `Child.op_load` build them); the verdict's
categories come from here. The child's guards can be tampered with by the candidate in its process: their reports are
evidence of what was done, not proof of what was not.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch

from kbv.protocols.verified.rules import POISON_MAGNITUDE, STATE_ATOL, STATE_RTOL, WEIGHT_COPIES
from kbv.verdict import Category


def integrity_evidence(reply: dict[str, Any], reference_changes: Mapping[str, Sequence[Any]] | None = None,
                       reference_state: Collection[str] | None = None) -> dict[str, str]:
    """Integrity violations (category value -> evidence) in a checked forward's reply: the outputs'
    own metadata and the child's before/after comparisons of inputs and parameters.

    A changed parameter or buffer is a finding only under a name of the reference's state
    (`reference_state`: its state_dict keys, the trial's state; None: every name is the
    reference's), and only if it did not change as one of the reference's own changed on the same
    inputs (`reference_changes`, from `Reference.state_changes`: BatchNorm's running statistics in
    training mode), whatever its name. A tensor under a name of its own is the candidate's: filling
    or updating it (a lazily derived weight, its own scratch) mutates nothing of the model's. One
    that the reference's call changes too is said to change otherwise than that call does."""
    found: dict[str, str] = {}
    report = dict(reply.get("integrity") or {})
    for meta in reply.get("outputs", []):
        if meta.get("tensor") and not meta.get("exact_type"):
            found.setdefault(Category.NOT_A_TENSOR.value, f"the output is a {meta['type']}, not a torch.Tensor")
        if meta.get("tensor") and (not meta.get("strided", True) or meta.get("internal_overlap")):
            found.setdefault(Category.WRONG_LAYOUT.value, "the output overlaps itself (an expanded view)")
    evidence = {
        Category.INPUT_MUTATED: _listed("input(s) {} changed by the call", report.get("inputs_mutated")),
        Category.PARAMETER_MUTATED: _parameters_changed(report.get("params_mutated"), reference_changes or {},
                                                        reference_state),
        Category.ALIASES_INPUT: _listed("the output shares storage with input(s) {}", report.get("aliases_input")),
        # an output in a buffer of its own is still one the next call overwrites: every name counts
        Category.ALIASES_PARAMETER: _listed("the output shares storage with parameter(s) {}",
                                            report.get("aliases_parameter")),
    }
    for cat, text in evidence.items():
        if text:
            found.setdefault(cat.value, text)
    for meta in reply.get("outputs", []):
        if meta.get("tensor") and meta.get("device") and meta.get("expected_device") and \
                meta["device"] != meta["expected_device"]:
            found.setdefault(Category.WRONG_DEVICE.value, f"output on {meta['device']}")
    return found


def overwrite_evidence(reply: dict[str, Any]) -> str:
    """The evidence of aliasing in the reply of the call after a checked one ("" for none): an
    output in the storage of the checked call's output, which the candidate still held, so every
    call overwrites what the one before returned. Its buffer may live anywhere (an attribute, a
    module global, a cache, the static output of a CUDA graph, torch.compile's own among them): unlike
    `aliases_parameter`, this names no tensor of the model."""
    overwritten = reply.get("overwrites_previous_output")
    if not overwritten:
        return ""
    return _listed("output(s) {} lie in the storage of the previous call's output, which still reads: every call "
                   "overwrites what the one before returned (a buffer the candidate keeps, or the static output of "
                   "a CUDA graph it replays, torch.compile's included; a clone returns a fresh tensor)", overwritten if isinstance(overwritten, list)
                   else ["(unreadable report)"])


def _listed(text: str, names: Any) -> str:
    return text.format(", ".join(map(str, names))) if names else ""


def _parameters_changed(mutated: Any, reference: Mapping[str, Sequence[Any]], state: Collection[str] | None) -> str:
    """The evidence of parameter_mutated in the child's `mutated` report ("" for none).

    Changes under names outside the reference's `state` are the candidate's own and are left out.
    That opens no hole: a tensor of its own is state like a Python attribute (a counter, a dict of
    answers), which this comparison never saw either, and what such state does to the outputs is
    judged by what judges outputs: correctness on every trial (weights rebuilt and drawn per trial,
    so a cache made from weights other than the trial's fails: L2/23 of the CUDA-L1 audit), the
    second run on identical inputs (state that changes every call) and the replay and result-cache
    probes (answers kept). A candidate that keeps all its weights under names of its own is handed
    none of the reference's (the load needs its keys) and is judged as built under each trial's
    seed. What is guarded here is the model's state under the reference's names, which the caller
    holds and kbv hands in."""
    if not isinstance(mutated, (dict, list)):
        return _listed("parameter(s) {} changed by the call", ["(unreadable report)"]) if mutated else ""
    names = [n for n in _unexplained(mutated, reference) if state is None or n in state]
    alone = [n for n in names if n not in reference]
    otherwise = [n for n in names if n in reference]
    return "; ".join(t for t in (_listed("parameter(s) {} changed by the call", alone),
                                 _listed("parameter(s) {} changed by the call otherwise than the reference's "
                                         "own call changes them", otherwise)) if t)


def _unexplained(mutated: dict[Any, Any] | list[Any], reference: Mapping[str, Sequence[Any]]) -> list[str]:
    """The names of `mutated` (the child's name -> [shape, sum, sum of squares], or bare names) whose
    new values no change of the reference's accounts for: one of the same shape whose sum and sum of
    squares agree within STATE_RTOL of their scale (and STATE_ATOL an element)."""
    if isinstance(mutated, list):
        return [str(n) for n in mutated]
    return [str(name) for name, said in mutated.items()
            if not any(_same_change(said, ref) for ref in reference.values())]


def _same_change(said: Any, ref: Sequence[Any]) -> bool:
    try:
        shape, total, squares = list(said[0]), float(said[1]), float(said[2])
    except (TypeError, ValueError, IndexError):  # a reply the candidate forged
        return False
    ref_shape, ref_total, ref_squares = list(ref[0]), float(ref[1]), float(ref[2])
    numel = max(math.prod(int(d) for d in ref_shape), 1)
    squares_scale = max(squares, ref_squares)
    total_scale = math.sqrt(numel * squares_scale)  # bounds |sum| (Cauchy-Schwarz): a mean near 0 is no trap
    floor = STATE_ATOL * math.sqrt(numel)
    return (shape == ref_shape and abs(total - ref_total) <= STATE_RTOL * total_scale + floor
            and abs(squares - ref_squares) <= STATE_RTOL * squares_scale + floor * floor)


def poison_shown(first: Sequence[torch.Tensor], second: Sequence[torch.Tensor],
                 truth: Sequence[torch.Tensor]) -> list[torch.Tensor] | None:
    """Where the poison shows in two runs of one trial on identical inputs (the first over NaN, the
    second over the sentinel, or zeros on a CPU): one mask per output of the elements where the runs
    differ, the truth is finite and below POISON_MAGNITUDE, and either run's value is not (NaN, an
    infinity, the sentinel or what a kernel made of it). None where it shows nowhere: runs that
    disagree there were not told apart by the poison (a race, atomics summing in another order).
    Integer outputs show none."""
    masks = []
    for a, b, t in zip(first, second, truth):
        if not (a.is_floating_point() and b.is_floating_point()):
            masks.append(torch.zeros(a.shape, dtype=torch.bool, device=a.device))
            continue
        a, b, t = a.double(), b.double(), t.double()
        wild = ~_tame(a) | ~_tame(b)
        differ = ~((a == b) | (torch.isnan(a) & torch.isnan(b)))
        masks.append(wild & differ & _tame(t))
    return masks if any(bool(m.any()) for m in masks) else None


def _tame(x: torch.Tensor) -> torch.Tensor:
    return torch.isfinite(x) & (x.abs() < POISON_MAGNITUDE)


def guard_evidence(report: dict[str, Any]) -> dict[str, str]:
    """Hack evidence (category value -> evidence) from the child's guards around one checked call."""
    from kbv.sandbox.guards import MODE_PREFIX, OPERATOR_PREFIX, is_timer

    hacks: dict[str, str] = {}
    guards = report.get("guards") or {}
    for category, evidence in guards.get("events", []):
        hacks.setdefault(Category(category).value, evidence)
    for name in guards.get("tampered", []):
        if name.startswith(OPERATOR_PREFIX):
            hacks.setdefault(Category.HARNESS_PATCH.value,
                             f"{name}: every call of them runs its code, the harness's copies and checks too")
            continue
        if name.startswith(MODE_PREFIX):
            hacks.setdefault(Category.HARNESS_PATCH.value,
                             f"{name} after its call: every tensor operation after it runs its code, the harness's too")
            continue
        cat = Category.TIMER_PATCH if is_timer(name) else Category.HARNESS_PATCH
        hacks.setdefault(cat.value, f"{name} was replaced after the candidate was imported")
    if report.get("deferred"):
        hacks.setdefault(Category.DEFERRED_WORK.value, "the output changed after the call had returned")
    if report.get("unjoined"):
        hacks.setdefault(Category.SIDE_STREAM.value,
                         "the output was still being written, at return, by work the current stream does not wait for")
    threads = report.get("threads")
    if threads and threads[1][0] > threads[0][0]:
        hacks.setdefault(Category.THREAD_INJECTION.value,
                         f"{threads[1][0] - threads[0][0]} Python thread(s) still running after the call")
    elif threads and report.get("calls", 0) > 1 and threads[1][1] > threads[0][1] >= 0:
        # OS threads (C++ std::thread, raw _thread) alive after a call; the first call may start
        # the runtime's own pools, later ones have no reason to
        hacks.setdefault(Category.THREAD_INJECTION.value,
                         f"{threads[1][1] - threads[0][1]} OS thread(s) still running after the call")
    if report.get("persisting_l2"):
        hacks.setdefault(Category.PERSISTING_L2.value,
                         f"the call left {report['persisting_l2']} (persisting lines survive the L2 flush)")
    if report.get("flags_changed"):
        hacks.setdefault(Category.PRECISION_FLAGS.value, f"precision flags changed by the call: {report['flags_changed']}")
    return hacks


RETAINED_FLOOR_BYTES = 1 << 20  # held tensors under 1 MiB are never flagged: tables, constants, small scratch


def io_bytes(inputs: Sequence[Any], outputs: Sequence[Any]) -> int:
    """The bytes of one set of inputs and outputs (tensors only): what `retained_state` compares with."""
    from kbv.inputs import tensor_bytes

    return tensor_bytes([*inputs, *outputs])


def retained_state(retained: dict[str, Any] | None, inputs_outputs_bytes: int,
                   reference_weights_bytes: int | None = None) -> tuple[Category, str] | None:
    """`retained_state` when the tensors a candidate holds after import and construction, beyond its
    parameters and buffers (the load reply's `retained`, from `kbv.sandbox.retained.find_retained`),
    exceed one set of inputs plus outputs and `RETAINED_FLOOR_BYTES`: room for precomputed answers,
    more than any workspace a forward needs at once. With `reference_weights_bytes` (the reference's
    state_dict), parameters and buffers beyond the reference's count as held too (answers registered
    as a buffer), and one copy of the reference's weights held anywhere is the candidate's own
    (`WEIGHT_COPIES`): a transposed, pre-scaled or folded weight made once at construction, which
    real kernels keep (seen on CUDA-L1's L2/12 and L2/22, pre-transposed GEMM weights as buffers).
    None otherwise, or when nothing was measured."""
    from kbv.sandbox.retained import format_bytes

    if not retained:
        return None
    held = int(retained.get("bytes") or 0)
    raw = int(retained.get("device_raw_bytes") or 0)  # device memory taken outside PyTorch's allocator
    if raw and held >= 0:
        held += raw
    extra, copies = 0, 0
    if reference_weights_bytes is not None and retained.get("weights_bytes") is not None:
        extra = max(int(retained["weights_bytes"]) - reference_weights_bytes, 0)
        copies = WEIGHT_COPIES * reference_weights_bytes
    if held < 0 or held + extra <= max(inputs_outputs_bytes, RETAINED_FLOOR_BYTES) + copies:
        return None
    where = list(retained.get("where", []))[:4]
    if raw:
        where.append(f"{format_bytes(raw)} of device memory allocated outside PyTorch at import and construction")
    if extra:
        where.append(f"parameters and buffers {format_bytes(extra)} beyond the reference's")
    launches = retained.get("launches") or {}
    work = (f"; {sum(launches.values())} launch(es) of its own kernels before its first call "
            f"({', '.join(sorted(launches))[:120]})") if launches else ""
    if retained.get("device_launches"):
        work += f"; {retained['device_launches']} kernel launch(es) on the device at import and construction"
    return Category.RETAINED_STATE, (
        f"held {format_bytes(held + extra)} of tensors after import and construction besides its weights, "
        f"more than one set of inputs and outputs ({format_bytes(inputs_outputs_bytes)})"
        f"{f' and one copy of the weights ({format_bytes(copies)})' if copies else ''}: "
        f"{'; '.join(map(str, where)) or 'not named'}{work}")
