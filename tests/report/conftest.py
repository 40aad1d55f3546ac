"""Report fixtures: a run holding the SAMPLE study, with the hacked candidate's source where the run
says its candidates were, and its HTML report."""

from __future__ import annotations

from pathlib import Path

import pytest

from records import CACHE_SOURCE, SAMPLE, write_run


@pytest.fixture(scope="module")
def sample_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sample")
    (root / "cands").mkdir()
    (root / "cands" / "19_ReLU__relu_cache.py").write_text(CACHE_SOURCE)
    return write_run(root / "run", SAMPLE, candidates=str(root / "cands"))


@pytest.fixture(scope="module")
def sample_html(sample_run: Path) -> str:
    from kbv.report.publish import write_report

    written = write_report([str(sample_run)], "html")
    assert written.path == sample_run / "report.html" and written.verdicts == len(SAMPLE)
    return written.path.read_text(encoding="utf-8")
