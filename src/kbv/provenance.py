"""Hardware and software provenance, recorded with every run and verdict."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import platform
import subprocess
from collections.abc import Iterator
from typing import Any

import torch

import kbv
from kbv.precision import snapshot_flags


def collect_provenance(device: str) -> dict[str, Any]:
    """Device name, driver, versions and default precision flags (JSON-safe)."""
    info: dict[str, Any] = {
        "kbv": kbv.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": _version("triton"),
        "device": device,
        "precision_flags": snapshot_flags(),
        "cpu": _cpu_name(),
    }
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        info.update({
            "device_name": props.name,
            "capability": f"{props.major}.{props.minor}",
            "device_memory_bytes": props.total_memory,
            "l2_cache_bytes": getattr(props, "L2_cache_size", None),
            "sm_count": props.multi_processor_count,
            "driver": _driver_version(),
        })
    else:
        info["device_name"] = info["cpu"]
    return info


def device_fingerprint(provenance: dict[str, Any]) -> str:
    """What must match for a stored verdict to be reused: device, driver and software versions."""
    keys = ("device_name", "driver", "torch", "cuda", "triton", "kbv")
    text = "|".join(str(provenance.get(k)) for k in keys)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


@contextlib.contextmanager
def nvml_session(device: str | None = None) -> Iterator[tuple[Any, Any]]:
    """One NVML session: (pynvml, the handle of CUDA `device` or None). The handle is matched by PCI bus
    id, because CUDA (and CUDA_VISIBLE_DEVICES) and NVML number GPUs differently. Raises when NVML
    (nvidia-ml-py) is missing or fails; callers treat that as "not known"."""
    import pynvml  # nvidia-ml-py, where installed

    pynvml.nvmlInit()
    try:
        handle = None
        if device is not None and device.startswith("cuda"):
            bus = getattr(torch.cuda.get_device_properties(torch.device(device)), "pci_bus_id", None)
            for i in range(pynvml.nvmlDeviceGetCount()):
                candidate = pynvml.nvmlDeviceGetHandleByIndex(i)
                if handle is None or (bus is not None and int(pynvml.nvmlDeviceGetPciInfo(candidate).bus) == int(bus)):
                    handle = candidate
        yield pynvml, handle
    finally:
        pynvml.nvmlShutdown()


def _driver_version() -> str | None:
    with contextlib.suppress(Exception), nvml_session() as (pynvml, _):
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    with contextlib.suppress(Exception):
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    return None


def device_state(device: str) -> dict[str, Any]:
    """Clocks, temperature, power and other processes on the GPU now (NVML); {} on CPU or without NVML."""
    if not device.startswith("cuda"):
        return {}
    import os

    with contextlib.suppress(Exception), nvml_session(device) as (pynvml, handle):
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        return {
            "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "mem_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
            "temperature_c": pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
            "power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
            "utilization_pct": pynvml.nvmlDeviceGetUtilizationRates(handle).gpu,
            "processes": len(procs),
            "other_processes": sum(1 for p in procs if p.pid != os.getpid()),
        }
    return {}
