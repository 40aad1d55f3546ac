"""The ELF reader of the child (`kbv.sandbox.elf`) on real objects: a CUDA shared object nvcc built
here (its device code compressed, so only nvcc's host stubs name its kernels), the cubin of the same
source, and a C object. Kernel names come out as the profiler shows them once demangled."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from kbv.sandbox.elf import kernel_entries, read_symbols

pytestmark = pytest.mark.slow  # nvcc, once per session (the build cache)

KERNELS_CU = r"""
template <typename T> __global__ void relu_kernel(const T* x, T* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > T(0) ? x[i] : T(0);
}
static __global__ void hidden_kernel(float* y) { y[0] = 1.0f; }
namespace { __global__ void anon_kernel(float* y) { y[0] = 2.0f; } }
namespace ops { __global__ void scale_kernel(float* y, float s) { y[0] *= s; } }
extern "C" __global__ void ampere_sgemm_128x64_tn(float* y) { y[0] = 3.0f; }  // named like cuBLAS's
__global__ void gemm_kernel(float* y, int n) { y[0] = (float)n; }
void launch_all(const float* x, float* y, int n) {
    relu_kernel<float><<<1, 32>>>(x, y, n);
    hidden_kernel<<<1, 1>>>(y);
    anon_kernel<<<1, 1>>>(y);
    ops::scale_kernel<<<1, 1>>>(y, 2.0f);
    ampere_sgemm_128x64_tn<<<1, 1>>>(y);
    gemm_kernel<<<1, 1>>>(y, n);
}
"""
# as the profiler names them (the driver's mangled names, demangled)
PROFILED = {"void relu_kernel<float>(float const*, float*, int)", "hidden_kernel(float*)",
            "(anonymous namespace)::anon_kernel(float*)", "ops::scale_kernel(float*, float)",
            "ampere_sgemm_128x64_tn", "gemm_kernel(float*, int)"}


def _nvcc() -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    found = os.path.join(home, "bin", "nvcc") if home else None
    return found if found and os.path.exists(found) else shutil.which("nvcc")


@pytest.fixture(scope="module")
def built(cache_dir: Path) -> dict[str, Path]:
    """The source built as a shared object (device code compressed) and as a cubin, and a host
    object with no device code at all."""
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("needs nvcc")
    out = cache_dir / "elf" / hashlib.sha256(KERNELS_CU.encode()).hexdigest()[:16]
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels.cu").write_text(KERNELS_CU)
    (out / "plain.cpp").write_text("int twice(int x) { return 2 * x; }\n")
    commands = {"kernels.so": ["-shared", "-Xcompiler", "-fPIC", "-Xfatbin", "-compress-all", "kernels.cu"],
                "kernels.cubin": ["-cubin", "kernels.cu"], "plain.o": ["-c", "plain.cpp"]}
    for name, flags in commands.items():
        if not (out / name).exists():
            *flags, source = flags
            done = subprocess.run([nvcc, *flags, str(out / source), "-o", str(out / f"{name}.tmp")],
                                  capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                pytest.skip(f"nvcc could not build here: {done.stderr[-500:]}")
            os.replace(out / f"{name}.tmp", out / name)
    return {name: out / name for name in commands}


def _profiled(names: set[str]) -> set[str]:
    return {torch._C._demangle(n) if len(n) > 1 else n for n in names}


def test_nvccs_stubs_name_every_kernel_of_a_shared_object_and_nothing_else(built):
    assert _profiled(kernel_entries(built["kernels.so"].read_bytes())) == PROFILED


def test_device_code_embedded_uncompressed_and_ptx_entries_name_kernels(built):
    host, cubin = built["plain.o"].read_bytes(), built["kernels.cubin"].read_bytes()
    assert kernel_entries(host) == set()
    # a host ELF with bytes after it is still one: the cubin or PTX text stands in for what a
    # candidate embeds as a string and loads itself
    assert _profiled(kernel_entries(host + b"\0" * 8 + cubin)) >= PROFILED
    ptx = b"\n.version 8.0\n.target sm_80\n.visible .entry scale_rows(\n\t.param .u64 x\n)\n{\n\tret;\n}\n"
    assert kernel_entries(host + ptx) == {"scale_rows"}


def test_device_code_that_no_stub_names_gives_every_function_symbol(built, tmp_path):
    # stripped: only the dynamic symbols are left, and no stub among them
    if shutil.which("strip") is None:
        pytest.skip("needs strip")
    stripped = tmp_path / "stripped.so"
    subprocess.run(["strip", "--strip-all", str(built["kernels.so"]), "-o", str(stripped)], check=True)
    names = kernel_entries(stripped.read_bytes())
    assert "_Z10launch_allPKfPfi" in names and not any("__device_stub__" in n for n in names)


def test_the_reader_agrees_with_readelf(built):
    if shutil.which("readelf") is None:
        pytest.skip("needs readelf")
    path = built["kernels.so"]
    text = subprocess.run(["readelf", "-sW", str(path)], capture_output=True, text=True, check=True).stdout
    table = text[text.index("'.symtab'"):]
    rows = [line.split() for line in table.splitlines() if ":" in line.split(maxsplit=1)[0]]
    theirs = {r[7] for r in rows if len(r) >= 8 and r[3] in ("FUNC", "IFUNC") and r[6] != "UND"}
    ours = {s.name for s in read_symbols(path.read_bytes()) if s.function and s.defined}
    assert ours == theirs and len(ours) > 100


def test_a_file_that_is_not_elf_is_refused():
    for data in (b"", b"#!/bin/sh\n", b"\x7fELF" + b"\0" * 10):
        with pytest.raises(ValueError):
            read_symbols(data)
