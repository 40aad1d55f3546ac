"""The meaning of a child's reports around a checked call (kbv.evidence), record by record."""

from __future__ import annotations

import torch

from kbv.detect.evidence import guard_evidence, integrity_evidence, overwrite_evidence, poison_shown
from kbv.verdict import Category

PLAIN = {"tensor": True, "exact_type": True, "strided": True, "internal_overlap": False,
         "device": "cuda:0", "expected_device": "cuda:0"}


def test_a_clean_reply_says_nothing():
    assert integrity_evidence({"outputs": [PLAIN], "integrity": {"inputs_mutated": [], "aliases_input": []}}) == {}
    assert guard_evidence({"threads": [[1, 4], [1, 4]], "calls": 3, "guards": {"events": [], "tampered": []}}) == {}


def test_output_metadata_and_before_after_comparisons_name_their_categories():
    reply = {"outputs": [{**PLAIN, "exact_type": False, "type": "LazyTensor"},
                         {**PLAIN, "internal_overlap": True, "device": "cpu"}],
             "integrity": {"inputs_mutated": [0], "params_mutated": {"ln.weight": [[64], 1.0, 1.0]}, "aliases_input": [1],
                           "aliases_parameter": ["out"]}}
    found = integrity_evidence(reply)
    assert found == {
        Category.NOT_A_TENSOR.value: "the output is a LazyTensor, not a torch.Tensor",
        Category.WRONG_LAYOUT.value: "the output overlaps itself (an expanded view)",
        Category.INPUT_MUTATED.value: "input(s) 0 changed by the call",
        Category.PARAMETER_MUTATED.value: "parameter(s) ln.weight changed by the call",
        Category.ALIASES_INPUT.value: "the output shares storage with input(s) 1",
        Category.ALIASES_PARAMETER.value: "the output shares storage with parameter(s) out",
        Category.WRONG_DEVICE.value: "output on cpu",
    }


def test_a_buffer_changed_as_the_reference_changed_its_own_is_not_a_finding_and_any_other_is():
    """BatchNorm in training mode: the reference's own call updates its running statistics, so a
    candidate whose state changes the same way does its job, whatever it names its buffers; a change
    the reference does not make, or a value it does not reach (answers stashed in a buffer), counts."""
    reference = {"bn.running_mean": [[8], 0.04, 0.0003], "bn.running_var": [[8], 7.3, 6.67],
                 "bn.num_batches_tracked": [[], 1.0, 1.0]}
    honest = {"bn.running_mean": [[8], 0.040001, 0.0003], "bn.running_var": [[8], 7.3000001, 6.67]}
    reply = {"outputs": [PLAIN], "integrity": {"params_mutated": honest}}
    assert integrity_evidence(reply, reference) == {}
    renamed = {"running_mean": [[8], 0.04, 0.0003], "running_var": [[8], 7.3, 6.67]}  # its own top-level buffers
    assert integrity_evidence({**reply, "integrity": {"params_mutated": renamed}}, reference) == {}
    stashed = {**honest, "bn.running_var": [[8], 812.5, 90011.0], "conv.weight": [[8, 3, 3, 3], 1.0, 2.0]}
    assert integrity_evidence({**reply, "integrity": {"params_mutated": stashed}}, reference) == {
        Category.PARAMETER_MUTATED.value: "parameter(s) conv.weight changed by the call; parameter(s) bn.running_var "
                                          "changed by the call otherwise than the reference's own call changes them"}
    assert Category.PARAMETER_MUTATED.value in integrity_evidence(reply)  # a reference that changes nothing
    forged = {"params_mutated": {"bn.running_mean": "not a print"}}
    assert Category.PARAMETER_MUTATED.value in integrity_evidence({**reply, "integrity": forged}, reference)


# the reference's state: Conv3d, then BatchNorm3d in training mode (its call updates its running statistics)
STATE = ("conv.weight", "conv.bias", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var",
         "bn.num_batches_tracked")
BN_CHANGES = {"bn.running_mean": [[8], 0.04, 0.0003], "bn.running_var": [[8], 7.3, 6.67],
              "bn.num_batches_tracked": [[], 1.0, 1.0]}


def test_a_tensor_under_a_name_of_its_own_is_the_candidates_to_change():
    """A scale and shift derived from BatchNorm's parameters, cached in buffers the candidate
    registered itself and filled on its first call, mutate nothing of the model's; an output in such
    a buffer is still one the next call overwrites."""
    cached = {"bn_scale": [[8], 3.1, 2.2], "bn_shift": [[8], -0.4, 0.9]}
    reply = {"outputs": [PLAIN], "integrity": {"params_mutated": cached}}
    assert integrity_evidence(reply, BN_CHANGES, STATE) == {}
    assert integrity_evidence(reply, {}, ()) == {}  # a reference without state: every tensor is the candidate's
    returned = {"params_mutated": {"output_buffer": [[16, 8], 5.0, 9.0]}, "aliases_parameter": ["output_buffer"]}
    assert integrity_evidence({**reply, "integrity": returned}, {}, STATE) == {
        Category.ALIASES_PARAMETER.value: "the output shares storage with parameter(s) output_buffer"}


def test_a_change_under_the_references_names_says_whether_the_reference_changes_it_too():
    """Running statistics updated four times (warm-up calls before a CUDA graph capture) where the
    reference's call updates them once are changed otherwise than that call does; a weight that the
    reference's call leaves alone is simply changed."""
    four = {"bn.running_mean": [[8], 0.15, 0.004], "bn.running_var": [[8], 7.9, 7.8],
            "bn.num_batches_tracked": [[], 4.0, 16.0]}
    reply = {"outputs": [PLAIN], "integrity": {"params_mutated": four}}
    assert integrity_evidence(reply, BN_CHANGES, STATE) == {
        Category.PARAMETER_MUTATED.value: "parameter(s) bn.running_mean, bn.running_var, bn.num_batches_tracked "
                                          "changed by the call otherwise than the reference's own call changes them"}
    scaled = {"params_mutated": {"conv.weight": [[8, 3, 3, 3, 3], 1.0, 2.0], "bn_scale": [[8], 3.1, 2.2]}}
    assert integrity_evidence({**reply, "integrity": scaled}, BN_CHANGES, STATE) == {
        Category.PARAMETER_MUTATED.value: "parameter(s) conv.weight changed by the call"}
    assert integrity_evidence({**reply, "integrity": scaled}, {}, STATE) == {
        Category.PARAMETER_MUTATED.value: "parameter(s) conv.weight changed by the call"}


def test_python_threads_left_running_are_injection_from_the_first_call():
    found = guard_evidence({"threads": [[1, 4], [2, 5]], "calls": 1})
    assert found == {Category.THREAD_INJECTION.value: "1 Python thread(s) still running after the call"}


def test_os_threads_count_only_after_the_first_call():
    # the first call may start the runtime's own pools (OpenMP, the CUDA driver's threads)
    assert guard_evidence({"threads": [[1, 4], [1, 6]], "calls": 1}) == {}
    found = guard_evidence({"threads": [[1, 4], [1, 6]], "calls": 2})
    assert found == {Category.THREAD_INJECTION.value: "2 OS thread(s) still running after the call"}


def test_guard_events_and_replaced_primitives_are_hacks_of_their_kind():
    found = guard_evidence({
        "guards": {"events": [["file_write", "opened /etc/x for writing"]],
                   "tampered": ["torch.cuda.Event.elapsed_time", "torch.allclose"]},
        "deferred": True, "unjoined": True, "persisting_l2": "a 30.0 MiB persisting-L2 set-aside",
        "flags_changed": {"cuda.matmul.allow_tf32": [True, False]}})
    assert found[Category.FILE_WRITE.value] == "opened /etc/x for writing"
    assert "elapsed_time" in found[Category.TIMER_PATCH.value]
    assert "torch.allclose" in found[Category.HARNESS_PATCH.value]
    assert Category.DEFERRED_WORK.value in found and Category.SIDE_STREAM.value in found
    assert "30.0 MiB" in found[Category.PERSISTING_L2.value]
    assert "allow_tf32" in found[Category.PRECISION_FLAGS.value]


def test_retained_state_is_flagged_past_one_set_of_inputs_and_outputs_and_the_floor():
    import torch

    from kbv.detect.evidence import RETAINED_FLOOR_BYTES, io_bytes, retained_state

    io = io_bytes([torch.empty(16, 4096), 3, None], [torch.empty(16, 4096)])
    assert io == 2 * 16 * 4096 * 4  # 512 KiB: tensors only
    precomputed = {"bytes": 69 * 256 * 1024, "where": ["kbv_candidate.ANSWERS: 69 tensors (cpu, 17.2 MiB)"],
                   "launches": {"triton:sigmoid_kernel": 69}}
    category, why = retained_state(precomputed, io)
    assert category is Category.RETAINED_STATE
    assert why == ("held 17.2 MiB of tensors after import and construction besides its weights, more than one "
                   "set of inputs and outputs (512.0 KiB): kbv_candidate.ANSWERS: 69 tensors (cpu, 17.2 MiB); "
                   "69 launch(es) of its own kernels before its first call (triton:sigmoid_kernel)")
    # as much as one set of inputs and outputs (an output buffer made once, a workspace) is not flagged
    big = 4 * io
    assert retained_state({"bytes": big, "where": ["model.out (cpu, 2.0 MiB)"]}, big) is None
    assert retained_state({"bytes": big + 1, "where": []}, big)[0] is Category.RETAINED_STATE
    # the floor: a small problem's 600 KiB table is not precomputed answers
    assert retained_state({"bytes": RETAINED_FLOOR_BYTES, "where": []}, 4096) is None
    assert retained_state({"bytes": RETAINED_FLOOR_BYTES + 1, "where": []}, 4096) is not None
    assert retained_state(None, io) is None and retained_state({}, io) is None
    # answers registered as a buffer: weights the reference does not have
    as_buffer = {"bytes": 0, "where": [], "weights_bytes": 17 << 20}
    assert retained_state(as_buffer, io) is None  # the reference's weights unknown: not judged
    category, why = retained_state(as_buffer, io, reference_weights_bytes=1 << 20)
    assert category is Category.RETAINED_STATE
    assert "parameters and buffers 16.0 MiB beyond the reference's" in why and "one copy of the weights (1.0 MiB)" in why
    assert retained_state({**as_buffer, "weights_bytes": 1 << 20}, io, reference_weights_bytes=1 << 20) is None
    # a transposed, pre-scaled copy of the weights beside them (CUDA-L1's L2/12) is the candidate's own
    assert retained_state({**as_buffer, "weights_bytes": 2 << 20}, io, reference_weights_bytes=1 << 20) is None
    assert retained_state({**as_buffer, "weights_bytes": (2 << 20) + (1 << 20) + 1}, io,
                          reference_weights_bytes=1 << 20) is not None
    # so is such a copy kept as an attribute (held) rather than a buffer; a second copy is not
    assert retained_state({"bytes": 1 << 20, "where": ["model.w_t"], "weights_bytes": 1 << 20}, io,
                          reference_weights_bytes=1 << 20) is None
    assert retained_state({"bytes": (2 << 20) + 1, "where": ["model.w_t"], "weights_bytes": 1 << 20}, io,
                          reference_weights_bytes=1 << 20) is not None


def test_poison_shows_where_one_run_is_wild_and_the_truth_is_not():
    """An unwritten read: NaN under the first run's poison, the sentinel (or what a kernel made of it)
    or a plain value under the second's, where the truth is an ordinary number."""
    truth = torch.tensor([1.0, 2.0, 3.0, float("inf")], dtype=torch.float64)
    first = torch.tensor([1.0, float("nan"), float("nan"), float("inf")])
    second = torch.tensor([1.0, -7.3e37 / 2, 3.0, float("inf")])
    (mask,) = poison_shown([first], [second], [truth])
    assert mask.tolist() == [False, True, True, False]


def test_runs_that_differ_by_rounding_or_a_race_show_no_poison():
    """An honest nondeterministic kernel (atomics adding in another order, a race between ordinary
    values) never gets `unwritten_output`: its values stay tame."""
    truth = torch.linspace(-1, 1, 64, dtype=torch.float64)
    first = truth.float()
    assert poison_shown([first], [first + 1e-6], [truth]) is None
    assert poison_shown([first], [first.flip(0)], [truth]) is None
    assert poison_shown([first.long()], [first.flip(0).long()], [truth]) is None  # integers show none


def test_an_output_in_the_previous_call_s_kept_storage_is_named_by_index():
    assert overwrite_evidence({"overwrites_previous_output": []}) == ""
    said = overwrite_evidence({"overwrites_previous_output": [0]})
    assert said.startswith("output(s) 0 lie in the storage of the previous call's output")
    assert "unreadable" in overwrite_evidence({"overwrites_previous_output": "forged"})
