import os

# Before torch is imported anywhere: the parent's idle OpenMP workers must sleep, not spin, or on a
# 2-core box they steal the cores a sandbox child is being timed on (the CLI's main() does the same).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Shared fixtures: a hermetic environment and torch flags, one build cache per session, the `gpu`
# auto-skip, and the small problem tree the evaluation tests share.

from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from sources import RELU_PROBLEM, write_tree  # noqa: E402


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _restore_environ() -> Iterator[None]:
    """Every test leaves os.environ as it found it."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(autouse=True)
def _restore_torch_flags() -> Iterator[None]:
    """Every test leaves torch's global numerics flags (TF32, cuDNN, determinism) as it found them."""
    import torch

    from kbv.precision import flags_restored

    cudnn = torch.backends.cudnn
    saved = (cudnn.benchmark, cudnn.deterministic, torch.are_deterministic_algorithms_enabled())
    with flags_restored():  # the TF32 flags saved now, restored afterwards (lanes' threads still set theirs)
        yield
    cudnn.benchmark, cudnn.deterministic = saved[:2]
    torch.use_deterministic_algorithms(saved[2])


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The build cache of the whole session: pass it as `cache_dir=` / `--cache-dir` to every
    evaluation, so each C++ source is built once. $KBV_TEST_CACHE_DIR names one that outlives the
    session (a GPU session warms it before the tests; builds are keyed by content hash)."""
    shared = os.environ.get("KBV_TEST_CACHE_DIR")
    if shared:
        Path(shared).mkdir(parents=True, exist_ok=True)
        return Path(shared)
    return tmp_path_factory.mktemp("kbv-cache")


@pytest.fixture(scope="session")
def relu_problems(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A problem tree with one problem: level1/19_ReLU.py (ReLU of a 16x256 randn input)."""
    return write_tree(tmp_path_factory.mktemp("problems"), {"level1/19_ReLU.py": RELU_PROBLEM})


@pytest.fixture(scope="session")
def kernelbench_dir() -> Path:
    """KernelBench's problem folder (`level1/`.. beside its `src/`): $KBV_KERNELBENCH_DIR, else
    `../shared/kernelbench` beside the repository. Not ours: read, never copied; skipped where absent."""
    repo = Path(__file__).resolve().parents[1]
    path = Path(os.environ.get("KBV_KERNELBENCH_DIR") or repo.parent / "shared" / "kernelbench")
    if not (path / "level1").is_dir():
        pytest.skip(f"no KernelBench problem folder at {path} (set KBV_KERNELBENCH_DIR)")
    return path
