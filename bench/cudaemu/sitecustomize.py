"""Benches only: CUDA extension builds on a machine whose torch has no CUDA (a CPU wheel), so that
their cost can be measured there. On PYTHONPATH (`bench/builds.py --emulate-cuda`), every Python
process of a build sees `torch.utils.cpp_extension.CUDA_HOME` set to the CUDA toolkit found by nvcc,
and nvcc is told to skip the one header a CPU wheel lacks (`c10/cuda/impl/cuda_cmake_macros.h`,
through `C10_USING_CUSTOM_GENERATED_MACROS`). The link still fails (no libtorch_cuda): the compile
figures are what counts. Where torch has CUDA this does nothing."""

import importlib.abc
import os
import shutil
import sys

_TARGET = "torch.utils.cpp_extension"


def _cuda_home():
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home and os.path.isfile(os.path.join(home, "bin", "nvcc")):
            return home
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    real = os.path.realpath(nvcc)
    home = os.path.dirname(os.path.dirname(real))
    return home


class _Patch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            import importlib.util

            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module):
            original(module)
            import torch

            if torch.version.cuda is None and module.CUDA_HOME is None:
                module.CUDA_HOME = _cuda_home()
                flags = os.environ.get("NVCC_APPEND_FLAGS", "")
                if "C10_USING_CUSTOM_GENERATED_MACROS" not in flags:
                    os.environ["NVCC_APPEND_FLAGS"] = (flags + " -DC10_USING_CUSTOM_GENERATED_MACROS").strip()

        loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Patch())
