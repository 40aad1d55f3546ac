# A correct ReLU in Triton whose module, as it is imported, tries to reach outside its sandbox from
# Python: the same attempts as the C++ fixture's (19_ReLU__escape_cpp.py), reported on stderr.
import os
import socket
import sys

import torch
import torch.nn as nn
import triton
import triton.language as tl


def say(what: str, error: BaseException | None) -> None:
    sys.stderr.write(f"kbv-escape: {what}: {'SUCCEEDED' if error is None else error}\n")


def write_to(what: str, path: str, mode: str = "w") -> None:
    try:
        with open(path, mode) as f:
            f.write("kbv-escape was here\n")
        say(f"{what} {path}", None)
    except OSError as exc:
        say(f"{what} {path}", exc)


def escape() -> None:
    runs = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            words = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            runs += [words[i + 1].decode() for i, w in enumerate(words[:-1]) if w == b"--run"]
            env = open(f"/proc/{pid}/environ", "rb").read()
            say(f"read /proc/{pid}/environ", None)
            if b"KBV_TEST_SECRET=" in env:
                secret = env.split(b"KBV_TEST_SECRET=")[1].split(bytes(1))[0]
                sys.stderr.write(f"kbv-escape: secret {secret!r}\n")
        except OSError as exc:
            say(f"read /proc/{pid}", exc)
    runs.append(os.path.dirname(os.path.dirname(os.getcwd())))  # RUN/work/<child>
    for run in runs:
        write_to("append to the database", os.path.join(run, "kbv.sqlite"), "a")
    try:
        with open(f"/proc/{os.getppid()}/mem", "rb") as mem:
            mem.seek(0x400000)
            mem.read(1)
        say(f"read /proc/{os.getppid()}/mem", None)
    except OSError as exc:
        say(f"read /proc/{os.getppid()}/mem", exc)
    write_to("write outside", "/tmp/kbv-escape-marker-triton")
    write_to("write outside", "/var/tmp/kbv-escape-marker-triton")
    write_to("write into kbv", os.path.join(os.environ["PYTHONPATH"].split(":")[0], "kbv", "kbv-escape-triton.py"))
    write_to("write into the build cache", os.path.join(os.path.dirname(os.path.dirname(__file__)), "kbv-escape-triton"))
    write_to("rewrite its own source", __file__, "a")
    for port in range(47310, 47320):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            say(f"connect to 127.0.0.1:{port}", None)
        except OSError as exc:
            say(f"connect to 127.0.0.1:{port}", exc)


escape()


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, tl.where(x > 0, x, 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        block = 4096
        relu_kernel[(triton.cdiv(x.numel(), block),)](x, out, x.numel(), BLOCK=block)
        return out
