"""The templates' worked examples are real: each compiles and matches its reference on a GPU."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from kbv.generate.extract import fenced_blocks
from kbv.generate.prompts import Backend, builtin_template

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def load_module(code: str, path: Path):
    """Import `code` from a real file (Triton's @jit reads the source lines)."""
    path.write_text(code)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(path.stem, None)
    return module


@pytest.mark.parametrize("backend", list(Backend))
def test_worked_example_matches_its_reference(backend, tmp_path, monkeypatch):
    if backend is Backend.TRITON:
        pytest.importorskip("triton")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    reference_code, answer_code, _ = (b.code for b in fenced_blocks(builtin_template(backend).text))
    reference = load_module(reference_code, tmp_path / f"example_ref_{backend.value}.py")
    answer = load_module(answer_code, tmp_path / f"example_new_{backend.value}.py")
    init = reference.get_init_inputs()
    model, model_new = reference.Model(*init).cuda(), answer.ModelNew(*init).cuda()
    for x in (reference.get_inputs()[0], torch.randn(3, 1000), torch.tensor([float("nan"), -1.0, 2.0])):
        x = x.cuda()
        torch.testing.assert_close(model_new(x), model(x), equal_nan=True)
    empty = torch.empty(0, 7, device="cuda")
    assert model_new(empty).shape == (0, 7)
