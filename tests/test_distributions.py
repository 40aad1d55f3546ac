"""The hidden suite: drawing, calibration, pins, secret seeds."""

from __future__ import annotations

import types

import pytest
import torch

from kbv.errors import ProblemRunError

from kbv.compare import Tolerance
from kbv.distributions import (
    DISTRIBUTIONS,
    FP16_MAX,
    FP16_TINY,
    VARIANTS,
    calibrate,
    draw_inputs,
    is_continuous,
    pinned_variants,
    trial_seed,
)


def _module(source: str) -> types.ModuleType:
    m = types.ModuleType("p")
    exec(source, m.__dict__)
    return m


MIXED = """
import torch
def get_inputs():
    x = torch.rand(64, 32)
    idx = torch.randint(0, 10, (64,))
    mask = (torch.rand(64, 32) > 0.5).float()
    return [x, idx, mask, 3]
def get_init_inputs(): return []
"""


def _variant(dist, name):
    return next(v for v in VARIANTS[dist] if v.name == name)


def test_only_continuous_floats_are_redrawn_and_shapes_dtypes_stay():
    m = _module(MIXED)
    default = draw_inputs(m, VARIANTS["default"][0], 5, torch.device("cpu"))
    large = draw_inputs(m, _variant("large", "normal-1e3"), 5, torch.device("cpu"))
    assert [tuple(t.shape) for t in large[:3]] == [tuple(t.shape) for t in default[:3]]
    assert [t.dtype for t in large[:3]] == [t.dtype for t in default[:3]]
    assert torch.equal(large[1], default[1])  # integers: the problem's own generator
    assert torch.equal(large[2], default[2])  # a 0/1 mask keeps its value set
    assert large[3] == 3
    assert float(large[0].abs().mean()) > 100 and float(large[0].min()) < 0


TRIANGULAR = """
import torch
def get_inputs():
    return [torch.triu(torch.rand(64, 64)), torch.tril(torch.rand(64, 64)), torch.rand(64, 64),
            torch.triu(torch.rand(2048, 2048))]  # its first 32 rows: under 1% zeros
def get_init_inputs(): return []
"""


def test_a_triangular_input_keeps_its_zeros_on_every_distribution():
    """The problem promises triangular matrices (KernelBench's L1/14 and L1/15): a redraw changes their
    values, never their zero half, so a kernel that skips it is judged on the inputs it was promised
    (CUDA-L1's kernels for both were value_mismatch on dense hidden inputs). A dense input stays dense."""
    m = _module(TRIANGULAR)
    own = draw_inputs(m, VARIANTS["default"][0], 9, torch.device("cpu"))
    for dist in DISTRIBUTIONS[1:]:
        upper, lower, dense, big = draw_inputs(m, VARIANTS[dist][0], 9, torch.device("cpu"))
        assert torch.equal(upper, torch.triu(upper)) and torch.equal(lower, torch.tril(lower)), dist
        assert torch.equal(big, torch.triu(big)), dist  # judged on the whole matrix, not its first rows
        assert bool((torch.triu(upper) != 0).sum() > 64 * 65 // 2 - 8), dist  # the upper half is redrawn, not zeroed
        assert not torch.equal(upper, own[0]), dist
        assert int((dense == 0).sum()) == 0, dist


def test_draws_depend_on_the_seed_only():
    m = _module(MIXED)
    a = draw_inputs(m, _variant("signed", "normal"), 11, torch.device("cpu"))
    b = draw_inputs(m, _variant("signed", "normal"), 11, torch.device("cpu"))
    c = draw_inputs(m, _variant("signed", "normal"), 12, torch.device("cpu"))
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], c[0])


def test_secret_seeds_differ_per_secret_distribution_and_trial():
    s = {trial_seed(b"a", "h", "signed", 0), trial_seed(b"b", "h", "signed", 0),
         trial_seed(b"a", "h", "large", 0), trial_seed(b"a", "h", "signed", 1)}
    assert len(s) == 4
    assert trial_seed(b"a", "h", "signed", 0) == trial_seed(b"a", "h", "signed", 0)


def test_few_valued_detection():
    assert is_continuous(torch.rand(100))
    assert not is_continuous(torch.randint(0, 2, (100,)).float())
    assert not is_continuous(torch.arange(10))


LOG = """
import torch
class Model(torch.nn.Module):
    def forward(self, x): return torch.log(x)
def get_inputs(): return [torch.rand(32, 32) + 0.1]
def get_init_inputs(): return []
"""
EXP = """
import torch
class Model(torch.nn.Module):
    def forward(self, x): return torch.exp(x)
def get_inputs(): return [torch.rand(32, 32)]
def get_init_inputs(): return []
"""


def _calibrate(source):
    m = _module(source)
    model = m.Model()
    return calibrate(m, "p.py", lambda xs: [model(*xs)], torch.device("cpu"))


def test_calibration_steps_to_milder_variants_and_says_why():
    log = _calibrate(LOG)
    assert log.variants["signed"] == "positive"
    assert "not finite" in log.notes["signed"]
    exp = _calibrate(EXP)
    assert exp.variants["large"] == "normal-10"  # 1e3 and 1e2 overflow exp
    assert exp.variants["small"] == "normal-1e-3"


def test_a_distribution_where_nothing_works_is_not_applicable():
    const = _module("""
import torch
class Model(torch.nn.Module):
    def forward(self, x): return torch.clamp(x, min=1e9)
def get_inputs(): return [torch.rand(8)]
def get_init_inputs(): return []
""")
    model = const.Model()
    cal = calibrate(const, "c.py", lambda xs: [model(*xs)], torch.device("cpu"))
    assert cal.variants["signed"] is None and "not applicable" in cal.notes["signed"]
    assert cal.applicable() == []


def test_problems_can_pin_variants_and_bad_pins_are_errors():
    m = _module(LOG + '\nKBV_DISTRIBUTIONS = {"large": "positive-1e2", "small": "skip"}\n')
    assert pinned_variants(m, "p.py") == {"large": "positive-1e2", "small": None}
    cal = _calibrate(LOG + '\nKBV_DISTRIBUTIONS = {"large": "positive-1e2", "small": "skip"}\n')
    assert cal.variants["large"] == "positive-1e2" and cal.variants["small"] is None
    with pytest.raises(ProblemRunError, match="unknown distribution"):
        pinned_variants(_module('KBV_DISTRIBUTIONS = {"huge": "skip"}'), "p.py")
    with pytest.raises(ProblemRunError, match="expected 'skip' or one of"):
        pinned_variants(_module('KBV_DISTRIBUTIONS = {"large": "enormous"}'), "p.py")


# ---- range: fp32's dynamic range, beyond fp16's ------------------------------------------------

def test_range_reaches_past_fp16_at_both_ends_with_both_signs():
    m = _module(MIXED)
    x = draw_inputs(m, VARIANTS["range"][0], 5, torch.device("cpu"))[0]
    mag = x.abs()
    assert float(mag.max()) > FP16_MAX and float(mag.max()) <= 1e6 * (1 + 1e-6)
    assert float(mag.min()) < FP16_TINY and float(mag.min()) >= 1e-7 * (1 - 1e-6)
    assert 0.04 < float((mag > FP16_MAX).float().mean()) < 0.15  # log10 65504 = 4.8: ~9% of [-7, 6]
    assert 0.15 < float((mag < FP16_TINY).float().mean()) < 0.28  # log10 6.1e-5 = -4.2: ~21%
    assert 0.4 < float((x < 0).float().mean()) < 0.6
    assert bool(torch.isinf(x.half()).any())  # what an fp16 copy of it holds
    positive = draw_inputs(m, _variant("range", "log-positive-1e-7-1e6"), 5, torch.device("cpu"))[0]
    assert float(positive.min()) > 0


def _calibrate_problem(problem):
    from kbv.problems import instantiate_problem
    from kbv.reference import Reference

    module = instantiate_problem(problem)
    reference = Reference(module, list(module.get_init_inputs()), torch.device("cpu"), "tf32")
    model = reference.build(3)
    return calibrate(module, problem.origin, lambda xs: reference.baseline_outputs(model, xs), torch.device("cpu"))


def test_every_bundled_problem_takes_the_widest_range_variant():
    """Softmax subtracts its row max, sigmoid and tanh saturate, norms divide the scale out, and the
    squares of 1e6 (MSE, RMSNorm, LayerNorm's variance) stay far inside fp32: every reference of the
    bundled suite stays finite and non-degenerate on log-uniform [1e-7, 1e6] with random signs."""
    from kbv.problems import load_suite

    problems = load_suite("smoke")
    assert len(problems) >= 16
    for problem in problems:
        cal = _calibrate_problem(problem)
        assert cal.variants["range"] == "log-1e-7-1e6", (problem.name, cal.notes)
        assert "range" not in cal.notes, problem.name
        assert "range" in cal.applicable()


SOFTMAX_NAIVE = """
import torch
class Model(torch.nn.Module):
    def forward(self, x):  # no max subtracted: exp overflows past ~88
        e = torch.exp(x)
        return e / e.sum(dim=1, keepdim=True)
def get_inputs(): return [torch.rand(8, 64)]
def get_init_inputs(): return []
"""


def test_range_steps_down_where_the_reference_overflows_or_leaves_its_domain():
    log = _calibrate(LOG)  # log of negatives: positive magnitudes, still [1e-7, 1e6]
    assert log.variants["range"] == "log-positive-1e-7-1e6"
    assert log.notes["range"] == "log-1e-7-1e6: reference output not finite"
    for source in (EXP, SOFTMAX_NAIVE):  # exp(1e5) is inf whatever the sign mix: only the tiny end is left
        cal = _calibrate(source)
        assert cal.variants["range"] == "normal-1e-6", cal.notes
        rejected = [part.split(":")[0] for part in cal.notes["range"].split("; ")]
        assert rejected == ["log-1e-7-1e6", "log-positive-1e-7-1e6", "normal-1e5", "positive-1e5"]
        assert "not finite" in cal.notes["range"]


def test_range_can_be_pinned_or_skipped_by_the_problem():
    pinned = _calibrate(EXP + '\nKBV_DISTRIBUTIONS = {"range": "positive-1e-6"}\n')
    assert pinned.variants["range"] == "positive-1e-6" and pinned.notes["range"] == "pinned by the problem"
    skipped = _calibrate(LOG + '\nKBV_DISTRIBUTIONS = {"range": "skip"}\n')
    assert skipped.variants["range"] is None and "range" not in skipped.applicable()
    assert skipped.notes["range"] == "skipped by the problem"
    with pytest.raises(ProblemRunError, match="log-1e-7-1e6, log-positive-1e-7-1e6, normal-1e5"):
        pinned_variants(_module('KBV_DISTRIBUTIONS = {"range": "normal-1e3"}'), "p.py")


def _judge(reference, model, inputs, candidate):
    """(passed, judgement) of `candidate(inputs)` under the verified protocol's acceptance test."""
    from kbv.compare import judge_outputs

    ev = reference.evaluate(model, inputs)
    j = judge_outputs([candidate(inputs)], ev.truth[:1], ev.baseline_err[:1], Tolerance())
    return j.passed, j


def _half(inputs):
    return [x.half().float() if isinstance(x, torch.Tensor) else x for x in inputs]


def _smoke(name):
    from kbv.problems import instantiate_problem
    from kbv.reference import Reference
    from kbv.problems import load_suite

    module = instantiate_problem(next(p for p in load_suite("smoke") if p.name == name))
    reference = Reference(module, list(module.get_init_inputs()), torch.device("cpu"), "tf32")
    return module, reference, reference.build(7)


def test_fp16_storage_overflows_on_range_where_honest_fp32_passes():
    """fp16 storage of the input (a sum, read at fp16) passes the problem's own inputs and fails on
    `range` with infinities where the truth is finite; the honest fp32 computation passes both."""
    module, reference, model = _smoke("7_SumReduction")
    for dist in ("default", "range"):
        inputs = draw_inputs(module, VARIANTS[dist][0], 11, torch.device("cpu"))
        honest, _ = _judge(reference, model, inputs, lambda xs: model(*xs))
        narrowed, err = _judge(reference, model, inputs, lambda xs: model(*_half(xs)))
        assert honest, dist
        assert narrowed == (dist == "default"), (dist, err)
    assert not err.worst.nan_inf_match  # range: +-inf where the truth is finite (nan_inf_mismatch)


def test_fp16_matmul_operands_pass_a_tf32_tolerance_and_fail_on_range_only(monkeypatch):
    """The H200's finding, on a CPU: with the tolerance a TF32 baseline sets (forced here; on a GPU
    TF32 changes a matmul's output), fp16 operands (TF32's 10-bit mantissa) pass every distribution but
    `range`, which the protocol reports as a distribution failure with NaN/Inf; TF32-truncated and
    fp32 operands pass everywhere; bf16 fails on precision, as before."""
    from kbv.reference import Reference, truncate_tf32
    from kbv.verdict import Category, Trial
    from kbv.protocols.verified.correctness import CorrectnessResult, _distribution_failure, _failure_category

    monkeypatch.setattr(Reference, "_tf32_matters", lambda *args: True)
    module, reference, model = _smoke("1_Matmul")
    kernels = {"fp16": lambda a, b: a.half().float() @ b.half().float(),
               "bf16": lambda a, b: a.bfloat16().float() @ b.bfloat16().float(),
               "tf32": lambda a, b: truncate_tf32(a) @ truncate_tf32(b), "fp32": torch.matmul}
    trials: dict[str, list[Trial]] = {k: [] for k in kernels}
    for dist in DISTRIBUTIONS:
        inputs = draw_inputs(module, VARIANTS[dist][0], 13, torch.device("cpu"))
        bf16 = reference.bf16_errors(model, inputs, reference.truth(model, inputs)[0])
        for name, kernel in kernels.items():
            ok, err = _judge(reference, model, inputs, lambda xs: kernel(*xs))
            trials[name].append(Trial(dist, 0, ok, category=None if ok else _failure_category(err, bf16)))
    failed = {name: {t.distribution: t.category for t in ts if not t.passed} for name, ts in trials.items()}
    assert failed["fp16"] == {"range": Category.NAN_INF_MISMATCH}
    assert failed["tf32"] == {} and failed["fp32"] == {}
    assert set(failed["bf16"]) >= {"signed", "range"} and set(failed["bf16"].values()) == {Category.PRECISION_LOSS}
    result = CorrectnessResult(trials["fp16"], [Category.NAN_INF_MISMATCH])
    _distribution_failure(result)
    assert result.categories == [Category.NAN_INF_MISMATCH, Category.DISTRIBUTION_FAILURE]


def test_a_tf32_convolution_passes_where_cudnn_may_pick_tf32_even_if_the_reference_got_an_exact_one(monkeypatch):
    """CUDA-L1's L2/6 and L2/7 on an H200: the reference's NCDHW Conv3d got an exact cuDNN algorithm, the
    candidate's channels-last one (cudnn.benchmark) a TF32 one, and an fp32-level allowance flagged its
    TF32-level error as precision_loss. Where cuDNN may pick TF32 (CUDA, forced here on a CPU), a
    convolution problem allows TF32 math whatever the reference got; bf16 math still fails; where it
    cannot (a CPU), the allowance stays the baseline's own."""
    import torch.nn.functional as F

    from kbv.reference import Reference, runs_ops, CONVOLUTIONS, truncate_tf32

    torch.manual_seed(3)
    conv = torch.nn.Conv3d(3, 16, 3)
    x = torch.randn(4, 3, 8, 12, 12)

    def tf32(xs):
        return F.conv3d(truncate_tf32(xs[0]), truncate_tf32(conv.weight), conv.bias)

    def bf16(xs):
        return F.conv3d(xs[0].bfloat16().float(), conv.weight.bfloat16().float(), conv.bias)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = conv

        def forward(self, x):
            return torch.softmax(self.conv(x), dim=1)

    model = Model()
    assert runs_ops(model, [x], CONVOLUTIONS) and not runs_ops(torch.nn.ReLU(), [x], CONVOLUTIONS)
    reference = Reference(types.ModuleType("p"), [], torch.device("cpu"), "tf32")
    softmax = lambda f: (lambda xs: torch.softmax(f(xs), dim=1))  # noqa: E731
    assert not _judge(reference, model, [x], softmax(tf32))[0]  # a CPU: no TF32 in the baseline's policy
    monkeypatch.setattr(Reference, "_cudnn_may_pick_tf32", lambda self: True)
    reference = Reference(types.ModuleType("p"), [], torch.device("cpu"), "tf32")
    assert _judge(reference, model, [x], softmax(tf32))[0]
    assert _judge(reference, model, [x], lambda xs: model(*xs))[0]
    assert not _judge(reference, model, [x], softmax(bf16))[0]
