"""The trust properties of the tensor channel (kbv.sandbox.channel), through real misbehaving candidates.

What the parent judges is its own copy of what a forward returned, taken the moment the reply
arrives, against its own pristine tensors, which it never shares. So a candidate that writes into its
inputs, writes past its output, or keeps its buffers and writes to them after returning changes
nothing the parent holds; and a child killed in the middle of a copy is `crashed`, with the parent's
tensors intact. CPU runs the shared-memory channel; the `gpu` tests run the device-to-device one.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from kbv.sandbox import ChildFailure, ChildSpec, Sandbox
from kbv.sandbox.channel import DeviceChannel, HostChannel
from kbv.verdict import Status

CALL_S = 60.0

# Returns zeros; keeps its inputs and output, writes past its output's end, writes into its inputs
# at once, and from a thread, half a second after returning and for two seconds, writes the true
# answer into everything it kept and into every kbv shared-memory file it could open during the call
# (on CPU the parent's input copy and output buffer among them). A harness
# that reads shared buffers late, or trusts memory the child can reach, would judge it correct.
SCRIBBLER = '''\
import glob
import os
import threading
import time

import torch
import torch.nn as nn

KEPT = []


def _scribble(x, out, truth, files):
    time.sleep(0.5)
    end = time.monotonic() + 2.0
    data = truth.detach().cpu().numpy().tobytes()
    while time.monotonic() < end:
        out.copy_(truth)
        x.copy_(truth)
        for kept in KEPT:
            kept.fill_(1.0)
        for f in files:  # opened while the call ran: the parent's files, unlinked or not
            try:
                f.seek(0)
                f.write(data[: os.fstat(f.fileno()).st_size])
                f.flush()
            except OSError:
                pass
        time.sleep(0.01)


def _shared_files():
    files = []
    for path in glob.glob("/dev/shm/kbv-shm-*/*") + glob.glob("/tmp/kbv-shm-*/*"):
        try:
            files.append(open(path, "r+b"))
        except OSError:
            pass
    return files


class ModelNew(nn.Module):
    def forward(self, x):
        truth = torch.relu(x).clone()
        big = torch.zeros(x.numel() + 4096, device=x.device, dtype=x.dtype)
        out = big[: x.numel()].view(x.shape)
        big[x.numel():] = 7.0  # past the output's end
        x.mul_(-1.0)  # into its input
        KEPT.extend([x, big])
        threading.Thread(target=_scribble, args=(x, out, truth, _shared_files()), daemon=True).start()
        return out
'''

KILLS_LATER = '''\
import os
import signal
import threading
import time

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        threading.Thread(target=lambda: (time.sleep(0.3), os.kill(os.getpid(), signal.SIGKILL)), daemon=True).start()
        return torch.relu(x)
'''


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


@pytest.fixture
def child(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Sandbox, torch.device]]:
    device = torch.device(request.param)
    spec = ChildSpec(work_dir=tmp_path / "work", build_dir=tmp_path / "build",
                     device="cuda:0" if device.type == "cuda" else "cpu",
                     parent_device=str(device) if device.type == "cuda" else None)
    with Sandbox(spec) as sb:
        sb.ready(CALL_S)
        yield sb, device


def _load(sb: Sandbox, tmp_path: Path, code: str) -> None:
    path = tmp_path / "build" / "candidate.py"  # where kbv puts it: its sandbox shows the build directory
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(code)
    sb.call({"op": "load", "source": "candidate", "path": str(path), "init_args": [], "seed": 0}, CALL_S)


def _forward(sb: Sandbox, x: torch.Tensor) -> tuple[dict, list[torch.Tensor] | None]:
    refs = sb.put([x], CALL_S)
    fields, receipt = sb.expect([x])
    reply = sb.call({"op": "forward", "inputs": refs, **fields}, CALL_S)
    return reply, sb.take(reply, receipt, CALL_S)


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("child", DEVICES, indirect=True)
def test_the_channel_matches_the_device(child):
    sb, device = child
    assert isinstance(sb.channel, DeviceChannel if device.type == "cuda" else HostChannel)


@pytest.mark.parametrize("child", DEVICES, indirect=True)
def test_a_scribbling_candidate_changes_nothing_the_parent_holds(child, tmp_path):
    sb, device = child
    _load(sb, tmp_path, SCRIBBLER)
    x = torch.randn(64, 1024, device=device)
    pristine = _digest(x)
    reply, outs = _forward(sb, x)
    assert reply["copied"] and outs is not None
    taken = _digest(outs[0])
    assert bool((outs[0] == 0).all()), "the parent's copy is what the forward returned: zeros"
    time.sleep(2.8)  # the candidate's thread writes for two seconds from half a second on
    assert _digest(x) == pristine, "the parent's own input is untouched"
    assert _digest(outs[0]) == taken, "the parent's copy of the output does not move after the reply"
    assert outs[0].data_ptr() != x.data_ptr()


@pytest.mark.parametrize("child", DEVICES, indirect=True)
def test_a_child_killed_after_answering_is_crashed_and_the_parent_keeps_its_tensors(child, tmp_path):
    sb, device = child
    _load(sb, tmp_path, KILLS_LATER)
    x = torch.randn(256, 1024, device=device)
    pristine = _digest(x)
    _, outs = _forward(sb, x)
    assert outs is not None and torch.equal(outs[0], torch.relu(x))
    time.sleep(0.6)  # the child is dead now
    with pytest.raises(ChildFailure) as failure:
        _forward(sb, x)
    assert failure.value.status is Status.CRASHED
    assert _digest(x) == pristine and torch.equal(outs[0], torch.relu(x))


@pytest.mark.gpu
@pytest.mark.parametrize("child", ["cuda"], indirect=True)
def test_a_child_killed_in_the_middle_of_a_device_copy_leaves_the_parent_whole(child, tmp_path, monkeypatch):
    """The parent maps the child's export, the child is killed, the parent copies: its own handle keeps
    the memory alive, the copy completes, the parent's CUDA context stays healthy, and the next call
    is `crashed`."""
    from kbv.sandbox import vmm

    sb, device = child
    _load(sb, tmp_path, "import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n"
                        "    def forward(self, x):\n        return torch.relu(x)\n")
    x = torch.randn(4096, 16384, device=device)  # 256 MiB
    pristine = _digest(x)
    opened = vmm.open_fd

    def open_then_kill(fd, size, index):
        mapping = opened(fd, size, index)
        sb.kill()  # the exporter dies with the parent's mapping in hand
        return mapping

    monkeypatch.setattr(vmm, "open_fd", open_then_kill)
    refs = sb.put([x], CALL_S)  # copied into the dead child's export: no fault in the parent
    monkeypatch.setattr(vmm, "open_fd", opened)
    assert refs
    y = torch.randn(1024, 1024, device=device)
    assert torch.allclose(y @ y, (y.double() @ y.double()).float(), rtol=1e-2, atol=1e-1)  # context healthy
    with pytest.raises(ChildFailure) as failure:
        sb.call({"op": "forward", "inputs": refs, **sb.expect([x])[0]}, CALL_S)
    assert failure.value.status is Status.CRASHED
    assert _digest(x) == pristine


LINEAR = '''\
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(x)
'''


@pytest.mark.parametrize("child", DEVICES, indirect=True)
def test_weights_sent_through_the_channel_are_the_ones_the_model_runs_with(child, tmp_path):
    """The verified trials hand the candidate their own weights (a state dict) across the boundary."""
    sb, device = child
    path = tmp_path / "build" / "candidate.py"  # where kbv puts it: its sandbox shows the build directory
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(LINEAR)
    w, b = torch.randn(4, 8, device=device), torch.randn(4, device=device)
    refs = sb.put([w, b], CALL_S)
    reply = sb.call({"op": "load", "source": "candidate", "path": str(path), "init_args": [], "seed": 0,
                     "state_dict": {"fc.weight": refs[0], "fc.bias": refs[1]}}, CALL_S)
    assert reply["state_loaded"]
    x = torch.randn(3, 8, device=device)
    fields, receipt = sb.expect([torch.empty(3, 4, device=device)])
    reply = sb.call({"op": "forward", "inputs": sb.put([x], CALL_S), **fields}, CALL_S)
    outs = sb.take(reply, receipt, CALL_S)
    assert outs is not None and torch.allclose(outs[0], x @ w.T + b, atol=1e-5)


RAISES_AT_ONCE = '''\
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x, fail):
        if fail:  # before any kernel of its own: the command returns while its input's clone still runs
            raise ValueError("refused")
        return torch.relu(x)
'''


@pytest.mark.gpu
@pytest.mark.parametrize("child", ["cuda"], indirect=True)
def test_a_command_that_returns_at_once_does_not_unmap_its_inputs_under_their_copy(child, tmp_path):
    """A child clones what it is handed off the export, then frees the export when the command ends.
    A command that ends before the clone has run (a forward that raises at once; a ghost replay whose
    first extension call raises) must not unmap under it: that fault is charged to the next call, and
    an honest kernel was once `cuda_error` for it."""
    sb, device = child
    _load(sb, tmp_path, RAISES_AT_ONCE)
    x = torch.randn(24576, 16384, device=device)  # 1.5 GiB: its clone outlasts the reply
    for _ in range(3):
        with pytest.raises(ChildFailure) as failure:
            sb.call({"op": "forward", "inputs": sb.put([x, True], CALL_S), **sb.expect([x])[0]}, CALL_S)
        assert "refused" in failure.value.message
    small = torch.randn(64, 64, device=device)
    fields, receipt = sb.expect([small])
    reply = sb.call({"op": "forward", "inputs": sb.put([small, False], CALL_S), **fields}, CALL_S)
    outs = sb.take(reply, receipt, CALL_S)
    assert outs is not None and torch.equal(outs[0], torch.relu(small))


def test_no_room_for_kbvs_own_buffer_is_the_runs_failure_only_where_the_child_held_little(monkeypatch):
    """On an H100 an identity of KernelBench's L1/11 came out `cuda_error`: the buffer kbv makes for the
    outputs found no room while the run's other problems held the device. Whose memory filled it is
    measured by the parent, the device's free memory before and after the child is killed: a child of
    1 GiB is not at fault (no verdict: the run's failure); a child that holds 60 of 80 GiB is, and so
    is one that says there was no room while the device had plenty."""
    from kbv.errors import DeviceRoomFailure
    from kbv.sandbox.child import _error_reply, _NoRoom

    gib = 1 << 30
    reply = _error_reply(_NoRoom("the device had no room for the 7.88 GiB buffer kbv makes in the candidate's "
                                 "child (VmmError: cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY (2))", int(7.88 * gib)))
    err = reply["error"]
    assert err["kind"] == "room" and err["needed_bytes"] == int(7.88 * gib) and not err["traceback"]

    def judged(free_before: float, free_after: float) -> Exception:
        readings = [(int(free_before * gib), 80 * gib)]  # before the kill; every reading after it: free_after

        def mem_get_info(device=None):
            return readings.pop(0) if readings else (int(free_after * gib), 80 * gib)

        monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
        sb = Sandbox(ChildSpec(work_dir=Path("w"), build_dir=Path("b"), device="cuda:0"))  # never started
        sb.channel = DeviceChannel(None, torch.device("cuda", 0))
        sb.stderr = sb.stdout = type("Quiet", (), {"total": 0, "text": lambda self, wait_s=0.0: ""})()
        return sb._candidate_error(err, "forward")

    others = judged(free_before=0.5, free_after=1.5)  # the child held 1 GiB
    assert isinstance(others, DeviceRoomFailure) and "held 1.0 GiB of the device's 80 GiB" in str(others)
    own = judged(free_before=0.5, free_after=60.5)
    assert isinstance(own, ChildFailure) and own.status is Status.CUDA_ERROR and "held 60 GiB" in own.message
    forged = judged(free_before=40.0, free_after=41.0)  # room enough: the child's word is not taken
    assert isinstance(forged, ChildFailure) and forged.status is Status.CUDA_ERROR
    # over a quarter of the device, but less than the parent's trials beside it: still the others' doing
    beside = judged(free_before=0.5, free_after=30.5)
    assert isinstance(beside, DeviceRoomFailure) and "others 50 GiB" in str(beside)
    err["needed_bytes"] = 100 * gib  # more than the device beside the child: no one else made it short
    larger = judged(free_before=0.5, free_after=1.5)
    assert isinstance(larger, ChildFailure) and larger.status is Status.CUDA_ERROR


@pytest.mark.gpu
@pytest.mark.parametrize("child", ["cuda"], indirect=True)
def test_inputs_kbv_cannot_hand_over_for_others_memory_are_no_verdict(child):
    """The device filled by the parent (as the run's other problems fill it): the buffer kbv makes in the
    child for a 2 GiB input finds no room, and that is the run's failure, not the candidate's."""
    from kbv.errors import DeviceRoomFailure

    sb, device = child
    free, _ = torch.cuda.mem_get_info(device)
    blocker = torch.empty(max(free - (1 << 30), 0), dtype=torch.uint8, device=device)  # 1 GiB left free
    try:
        x = torch.empty(1 << 29, dtype=torch.float32)  # 2 GiB: the child is asked for its buffer first
        with pytest.raises(DeviceRoomFailure, match="no room for the 2.00 GiB buffer"):
            sb.put([x], CALL_S)
    finally:
        del blocker
        torch.cuda.empty_cache()


