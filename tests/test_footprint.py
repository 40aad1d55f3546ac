"""A problem's footprint, traced on the meta device (kbv.footprint): the bytes its inputs, weights,
outputs and forward take, known before anything is allocated, and None where its code needs real
values."""

from __future__ import annotations

import resource
import types

import pytest
import torch

from kbv.footprint import format_bytes, trace_footprint
from verdict_log import log_figures

MIB = 1 << 20


def _module(source: str) -> types.ModuleType:
    module = types.ModuleType("problem")
    exec(compile(source, "problem.py", "exec"), module.__dict__)
    return module


LINEAR = """
import torch, torch.nn as nn
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 32)
    def forward(self, x):
        return torch.relu(self.fc(x))
def get_inputs():
    return [torch.rand(8, 64)]
def get_init_inputs():
    return []
"""

GELU = """
import math, torch, torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
def get_inputs():
    return [torch.rand(256, 1024)]
def get_init_inputs():
    return []
"""


def test_a_linear_layers_inputs_weights_and_outputs_are_counted_and_tf32_is_seen():
    fp = trace_footprint(_module(LINEAR))
    assert fp is not None
    assert fp.input_bytes == 8 * 64 * 4
    assert fp.weight_bytes == (64 * 32 + 32) * 4
    assert fp.output_bytes == 8 * 32 * 4
    assert fp.truth_bytes == 8 * 32 * 8  # the truth is float64
    assert fp.tf32 and "addmm" in fp.ops  # nn.Linear is a GEMM: TF32 changes its float32 result
    assert fp.forward_bytes >= fp.output_bytes


MLP = """
import torch, torch.nn as nn
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 256))
    def forward(self, x):
        return self.net(x)
def get_inputs():
    return [torch.rand(16, 4096)]
def get_init_inputs():
    return []
"""


def test_a_weight_transposed_for_a_gemm_is_a_view_and_costs_the_forward_nothing():
    """KernelBench's L3/1 MLP (2.5 GiB of weights) was planned with a 2.5 GiB forward: every linear
    layer's transposed weight counted as a new allocation, where it shares the weight's storage."""
    fp = trace_footprint(_module(MLP))
    assert fp is not None
    assert fp.weight_bytes > 64 * MIB
    assert fp.forward_bytes < MIB  # two activations of 16 x 4096 and the outputs: well under a MiB


def test_an_elementwise_forward_runs_no_tf32_operator_and_its_intermediates_show_in_its_peak():
    fp = trace_footprint(_module(GELU))
    assert fp is not None and not fp.tf32
    one = 256 * 1024 * 4
    assert fp.input_bytes == one and fp.output_bytes == one
    # pow, mul, add, mul, tanh, add, mul, mul: several temporaries of the input's size live at once
    assert 2 * one <= fp.forward_bytes <= 10 * one
    assert fp.float64_bytes == 2 * fp.forward_bytes
    assert fp.truth_call_bytes > fp.call_bytes


def test_a_problem_of_hundreds_of_gib_is_traced_without_allocating_it():
    huge = GELU.replace("torch.rand(256, 1024)", "torch.rand(1 << 20, 1 << 16)")  # 256 GiB
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    fp = trace_footprint(_module(huge))
    assert fp is not None and fp.input_bytes == 256 << 30
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 * 1024  # KiB: under 200 MiB
    assert format_bytes(fp.input_bytes) == "256 GiB"


def test_code_that_needs_real_values_or_places_its_inputs_itself_is_of_unknown_size():
    item = GELU.replace("return 0.5 * x", "if x.sum().item() > 0:\n            pass\n        return 0.5 * x")
    placed = GELU.replace("torch.rand(256, 1024)", "torch.rand(256, 1024, device='cpu')")
    assert trace_footprint(_module(item)) is None
    assert trace_footprint(_module(placed)) is None


def test_a_trace_past_its_budget_is_of_unknown_size():
    loop = GELU.replace("return 0.5 * x", "for _ in range(100000):\n            x = x + 1\n        return 0.5 * x")
    assert trace_footprint(_module(loop), budget_s=0.2) is None
    assert torch.get_default_device().type == "cpu"  # the meta device did not leak out of the trace


def test_sizes_read_as_a_person_writes_them():
    assert [format_bytes(n) for n in (512, 3 * 1024 + 300, 12 * MIB, 31 << 30)] == ["512 B", "3.3 KiB", "12 MiB",
                                                                                      "31 GiB"]


CHAIN = """
import torch, torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        kept = []
        for _ in range(6):
            x = torch.clamp(x + 1.0, min=0.0)
            KEEP
        return x
def get_inputs():
    return [torch.rand(1024, 1024)]
def get_init_inputs():
    return []
"""


def test_a_chain_of_steps_holds_what_eager_execution_holds_at_once():
    """Each step's temporaries die before the next step runs: six steps of `x = clamp(x + 1)` hold at
    most the step's input, its sum and its clamp (KernelBench's level-2 chains: L2/2's forward was
    counted 12 GiB where it holds 4 beyond its input). A forward that keeps every step's result holds
    all of them."""
    one = 1024 * 1024 * 4
    chain = trace_footprint(_module(CHAIN.replace("KEEP", "pass")))
    # the step's input (the step before's clamp), its sum and its clamp; the problem's input is counted apart
    assert chain is not None and chain.forward_bytes == 3 * one
    kept = trace_footprint(_module(CHAIN.replace("KEEP", "kept.append(x)")))
    assert kept is not None and kept.forward_bytes == 7 * one  # six kept clamps and the last sum


def _full_suite() -> list[str]:
    from kbv.problems import load_problems

    return [p.key for p in load_problems("full")]


@pytest.mark.gpu
@pytest.mark.parametrize("key", _full_suite())
def test_a_forward_runs_on_the_device_within_its_traced_cuda_peak(key: str) -> None:
    """Memory plans are made of the traced peak (`kbv.memory_plan`), so the device must run a forward
    within it. With the caching allocator held to what it has reserved for the inputs and weights, the
    traced CUDA peak (the reductions' staging buffers in it), 10% and 64 MiB, the forward runs: a buffer
    the trace left out does not fit (L1/7's and L1/12's reductions took 181 and 730 MiB for forwards
    traced at 1.4 and 4.2 MiB before the staging was counted), where cuDNN takes an algorithm whose
    workspace fits, as it does wherever memory is short. Unheld, the device's peak over a forward shows
    the trace errs high by no more than 3x and 64 MiB. A first forward, not measured, makes the
    libraries' handles and the workspaces a process keeps for good."""
    from kbv.footprint import problem_footprint
    from kbv.problems import instantiate_problem, load_problems

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    (problem,) = [p for p in load_problems("full") if p.key == key]
    device = torch.device("cuda", torch.cuda.current_device())  # the memory fraction wants an index
    traced = problem_footprint(problem, device)  # the staging of this card's split
    assert traced is not None
    fp = traced.on("cuda")
    module = instantiate_problem(problem)
    torch.manual_seed(0)
    model = module.Model(*module.get_init_inputs())
    model = model.to(device) if isinstance(model, torch.nn.Module) else model
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in module.get_inputs()]
    with torch.no_grad():
        model(*inputs)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    with torch.no_grad():
        outputs = model(*inputs)
    torch.cuda.synchronize()
    measured = torch.cuda.max_memory_allocated() - before
    del outputs
    torch.cuda.empty_cache()
    slack = 64 * MIB
    reserved = torch.cuda.memory_reserved()
    held = reserved + int(1.1 * fp.forward_bytes) + slack
    total = torch.cuda.get_device_properties(device).total_memory
    figures = {"traced": fp.forward_bytes, "traced_without_staging": traced.forward_bytes, "measured": measured,
               "allocated_before": before, "reserved": reserved, "held": held, "total": total}
    log_figures(f"footprint {key}", **figures)
    torch.cuda.set_per_process_memory_fraction(min(1.0, held / total), device)
    try:
        with torch.no_grad():
            model(*inputs)
        torch.cuda.synchronize()
    except torch.OutOfMemoryError as exc:
        log_figures(f"footprint {key} held", outcome=str(exc)[:600], peak=torch.cuda.max_memory_allocated(),
                    reserved_now=torch.cuda.memory_reserved())
        pytest.fail(f"{key}: a forward traced at {format_bytes(fp.forward_bytes)} on CUDA did not run in "
                    f"{format_bytes(held - before)} beyond its inputs and weights (unheld, it took {format_bytes(measured)}): "
                    f"{str(exc)[:300]}")
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
        torch.cuda.empty_cache()
    assert fp.forward_bytes <= 3 * measured + slack, (
        f"{key}: traced at {format_bytes(fp.forward_bytes)} for a forward the device ran in {format_bytes(measured)}")


def test_logsumexp_holds_its_shifted_exponential_as_large_as_its_input():
    """`torch.logsumexp` is one operator to the dispatcher, and inside it exponentiates its input less
    the maxima before it sums: a temporary as large as the input that its result does not show
    (KernelBench's L2 problems end in LogSumExp after a 1024 x 8192 GEMM)."""
    lse = GELU.replace("return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))",
                       "return torch.logsumexp(x, dim=1, keepdim=True)")
    fp = trace_footprint(_module(lse))
    assert fp is not None and "logsumexp" in fp.ops
    assert fp.forward_bytes == fp.input_bytes + fp.output_bytes
