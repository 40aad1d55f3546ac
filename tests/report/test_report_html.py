"""The HTML report, parsed: its sections, one row per verdict, the series each plot draws, golden
figures, each row's evidence; empty, partial and multi-model runs; a page that needs no network."""

from __future__ import annotations

import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from kbv.errors import UsageError
from kbv.report.format import format_pct, format_speedup
from kbv.report.publish import write_report
from kbv.verdict import Status
from pagetree import Node, parse
from records import GOLDEN, REPORTED, SAMPLE, verdict, write_run

SECTIONS = ["summary", "leaderboard", "plots", "pairs", "provenance"]


def plots_of(page: Node) -> dict[str, Node]:
    return {f.attrs["data-plot"]: f for f in page.find_all("figure") if f.has_class("plot")}


def drawn_series(figure: Node, key: str) -> int:
    """Distinct series whose artists made it into the figure's SVG (ids `<key>-series-<i>[-<j>]`)."""
    ids = [n.attrs.get("id") or "" for n in figure.find("svg").iter()]
    return len({m.group(1) for i in ids if (m := re.fullmatch(rf"{key}-series-(\d+)(-\d+)?", i))})


def pair_bodies(page: Node) -> list[Node]:
    return page.by_id("pairs-table").find_all("tbody", **{"class": "verdict"})


def summary_cells(page: Node) -> dict[str, list[str]]:
    table = page.by_id("summary-table")
    rows = [[td.text() for td in tr.find_all("td")] for tr in table.find("tbody").find_all("tr")]
    return {row[0]: row[1:] for row in rows}


def test_every_section_is_present_in_order(sample_html: str) -> None:
    page = parse(sample_html)
    assert [s.attrs["id"] for s in page.find_all("section") if s.attrs.get("data-section") == s.attrs.get("id")] \
        == SECTIONS


def test_one_row_per_verdict_each_with_a_hidden_evidence_row(sample_html: str) -> None:
    bodies = pair_bodies(parse(sample_html))
    assert len(bodies) == len(SAMPLE)
    for body in bodies:
        row, panel = body.find_all("tr")[:2]
        assert row.has_class("row") and panel.has_class("evidence") and "hidden" in panel.attrs
        assert row.attrs["aria-controls"] == panel.attrs["id"]
    shown = [(b.find("tr").find_all("td")[0].text(), b.find("tr").find_all("td")[2].text(),
              b.find("tr").find_all("td")[4].text()) for b in bodies]
    assert shown == [(v.problem, v.candidate, v.protocol) for v in REPORTED]


# (plot, series): fast_p per (model, protocol); speedups per protocol; agreement: verified, the
# result cache and the precision failure; memory per model; levels: correct and fast_1 per protocol.
EXPECTED_SERIES = {"fast_p": 4, "speedups": 2, "agreement": 3, "memory": 2, "levels": 4}


def test_each_plot_draws_the_expected_series(sample_html: str) -> None:
    figures = plots_of(parse(sample_html))
    assert list(figures) == list(EXPECTED_SERIES)
    for key, n in EXPECTED_SERIES.items():
        assert figures[key].attrs["data-series"] == str(n), key
        assert drawn_series(figures[key], key) == n, key


def test_agreement_plot_names_the_hack_by_category(sample_html: str) -> None:
    caption = plots_of(parse(sample_html))["agreement"].find("figcaption").text()
    assert "verified, failed verified, result_cache" in caption


def test_summary_has_both_protocols_with_the_golden_figures(sample_html: str) -> None:
    cells = summary_cells(parse(sample_html))
    assert [th.text() for th in parse(sample_html).by_id("summary-table").find_all("th")] == \
        ["figure", "standard", "verified"]
    for i, protocol in enumerate(("standard", "verified")):
        g = GOLDEN[protocol]
        assert cells["pairs"][i] == str(g["pairs"]) and cells["skipped"][i] == str(g["skipped"])
        assert cells["compile rate"][i] == format_pct(g["compile_rate"])
        assert cells["correct rate"][i] == format_pct(g["correct_rate"])
        for p in ("fast_0", "fast_1", "fast_2"):
            assert cells[p][i] == format_pct(g[p]), (protocol, p)
        assert cells["geomean speedup"][i] == f"{format_speedup(g['geomean'])} (n={4 if i == 0 else 2})"
        assert cells["raises peak memory"][i] == format_pct(g["memory"])
    for p in ("fast_0.5", "fast_0.8", "fast_1.5"):
        assert p in cells
    assert "failing pairs are left out" in parse(sample_html).by_id("summary").text()


def test_hacks_by_category(sample_html: str) -> None:
    hacks = parse(sample_html).by_id("hacks")
    rows = [[td.text() for td in tr.find_all("td")] for tr in hacks.find("tbody").find_all("tr")]
    assert rows == [["result_cache", "0", "1"]]


def test_leaderboard_one_row_per_model(sample_html: str) -> None:
    table = parse(sample_html).by_id("leaderboard-table")
    headers = [th.text() for th in table.find_all("th")]
    rows = {cells[0]: dict(zip(headers, cells)) for cells in
            ([td.text() for td in body.find_all("td")] for body in table.find_all("tbody"))}
    assert set(rows) == {"model-a", "model-b"}
    a, b = rows["model-a"], rows["model-b"]
    assert (a["pairs"], a["correct (standard)"], a["correct (verified)"]) == ("3", "100%", "33%")
    assert a["geomean (verified)"] == "1.50x (n=1)"
    assert a["standard passes, verified rejects"] == "2 of 3 pairs (hack 1, incorrect 1)"
    assert (b["pairs"], b["correct (standard)"], b["raises peak memory"]) == ("2", "50%", "100%")
    assert b["standard passes, verified rejects"] == "0 of 2 pairs"
    assert b["fast_1 (verified)"] == "0%" and b["geomean (standard)"] == "0.0031x (n=1)"


def _panel(page: Node, candidate: str, protocol: str) -> Node:
    for body in pair_bodies(page):
        cells = [td.text() for td in body.find("tr").find_all("td")]
        if cells[2] == candidate and cells[4] == protocol:
            return body.find_all("tr")[1]
    raise AssertionError((candidate, protocol))


def test_speedups_keep_their_digits_and_intervals(sample_html: str) -> None:
    page = parse(sample_html)
    speed = {(c[2], c[4]): c[7] for c in ([td.text() for td in b.find("tr").find_all("td")] for b in pair_bodies(page))}
    assert speed[("gemm_slow", "standard")] == "0.0031x"
    assert speed[("gemm_slow", "verified")] == "0.0029x [0.0028, 0.0030]"
    assert speed[("relu_cpp", "verified")] == "1.50x [1.42, 1.58]"
    assert speed[("gemm_half", "verified")] == "-"


def test_a_standard_timing_shows_its_spread_beside_its_mean(sample_html: str) -> None:
    page = parse(sample_html)
    timing = _panel(page, "relu_cpp", "standard").find("section", data_section="timing").text()
    assert "mean 0.5556 ± 0.01 ms (std), range 0.5556-0.5556 ms, n=50" in timing
    cell = next(b.find("tr").find_all("td")[7] for b in pair_bodies(page)
                if [td.text() for td in b.find("tr").find_all("td")][2:5:2] == ["relu_cpp", "standard"])
    assert cell.text() == "1.80x" and "candidate 0.5556 ± 0.01 ms, baseline 1 ± 0.01 ms" in cell.attrs["title"]


def test_a_category_is_named_once_in_its_cell(sample_html: str) -> None:
    page = parse(sample_html)
    for body in pair_bodies(page):
        cell = body.find("tr").find_all("td")[6]
        for text in (cell.text(), cell.attrs.get("title") or ""):
            for cat in cell.text().split(", "):
                if cat:
                    assert text.count(cat) == 1, text
    alias = next(b for b in pair_bodies(page) if b.find("tr").find_all("td")[2].text() == "mlp_alias"
                 and b.find("tr").find_all("td")[4].text() == "verified")
    assert alias.find("tr").find_all("td")[6].attrs["title"] == "aliases_input: the output aliases input 0"


def test_evidence_errors_per_distribution_against_allowed(sample_html: str) -> None:
    panel = _panel(parse(sample_html), "gemm_half", "verified")
    trials = panel.find("table", **{"class": "trials"})
    rows = [[td.text() for td in tr.find_all("td")] for tr in trials.find("tbody").find_all("tr")]
    assert [(r[0], r[2], r[3], r[4]) for r in rows] == [
        ("own", "yes", "1e-06", "0.0001"), ("mixed", "no", "0.03", "0.0001"),
        ("large", "yes", "1e-06", "0.0001"), ("small", "no", "0.03", "0.0001")]


def test_evidence_integrity_attribution_and_timing(sample_html: str) -> None:
    page = parse(sample_html)
    integrity = _panel(page, "mlp_alias", "verified").find("section", data_section="integrity").text()
    assert "integrity: aliases_input" in integrity and "the output aliases input 0" in integrity
    attribution = _panel(page, "relu_cpp", "verified").find("section", data_section="attribution").text()
    assert "97%" in attribution and "relu_kernel" in attribution
    timing = _panel(page, "relu_cache", "verified").find("section", data_section="timing").text()
    assert "result_cache: replayed" in timing and "baseline eager-tf32 (primary)" in timing


def test_findings_are_highlighted_in_the_candidates_source(sample_html: str) -> None:
    panel = _panel(parse(sample_html), "relu_cache", "verified")
    source = panel.find("pre", **{"class": "source"})
    hits = [n for n in source.iter() if n.tag == "span" and n.has_class("hit")]
    assert [h.attrs["id"].rsplit("-L", 1)[1] for h in hits] == ["6"]
    assert "cache.setdefault(x.data_ptr()" in hits[0].text() and "KBV-S502" in hits[0].attrs["title"]
    link = panel.find("table", **{"class": "findings"}).find("a")
    assert link.attrs["href"] == "#" + hits[0].attrs["id"]


def test_a_source_that_moved_is_said_to_be_missing(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", [v for v in SAMPLE if v.candidate == "relu_cache"],
                    candidates=str(tmp_path / "gone"))
    panel = _panel(parse(write_report([str(run)], "html").path.read_text()), "relu_cache", "verified")
    assert "KBV-S502" in panel.text() and "source was not found" in panel.text()
    assert not panel.find_all("pre", **{"class": "source"})


def test_provenance(sample_html: str) -> None:
    text = parse(sample_html).by_id("provenance").text()
    for shown in ("NVIDIA H200", "570.1", "2.13.0", "3.5.0", "allow_tf32", "0123456789abcdef",
                  "standard 1; verified 1"):
        assert shown in text, shown


def test_the_page_is_self_contained(sample_html: str) -> None:
    page = parse(sample_html)
    for node in page.iter():
        for attr in ("src", "href"):
            value = node.attrs.get(attr) or ""
            assert not re.match(r"(https?:)?//", value), (node.tag, value)
        assert node.tag not in ("link", "iframe", "img")
    assert not [s for s in page.find_all("script") if "src" in s.attrs]
    assert "@import" not in sample_html and "url(http" not in sample_html


def test_an_empty_run_still_gives_every_section(tmp_path: Path) -> None:
    run = write_run(tmp_path / "empty", [])
    page = parse(write_report([str(run)], "html").path.read_text())
    assert [s.attrs["id"] for s in page.find_all("section") if s.attrs.get("data-section") == s.attrs.get("id")] \
        == SECTIONS
    assert "no verdicts" in page.by_id("summary").text() and not page.find_all("tbody", **{"class": "verdict"})
    assert {k: f.attrs["data-series"] for k, f in plots_of(page).items()} == {k: "0" for k in EXPECTED_SERIES}


def test_a_partial_run_plots_only_what_it_has(tmp_path: Path) -> None:
    """A run stopped early: every pair has its standard verdict, one has its verified one."""
    partial = [v for v in SAMPLE if v.protocol == "standard"] + [SAMPLE[1]]
    page = parse(write_report([str(write_run(tmp_path / "partial", partial))], "html").path.read_text())
    assert len(pair_bodies(page)) == len(partial)
    figures = plots_of(page)
    assert figures["agreement"].attrs["data-series"] == "1"  # relu_cpp alone has both protocols
    assert figures["fast_p"].attrs["data-series"] == "3"  # model-a twice, model-b standard only
    assert drawn_series(figures["fast_p"], "fast_p") == 3
    assert summary_cells(page)["correct rate"] == ["80%", "100%"]


def test_several_runs_and_models_give_one_leaderboard(tmp_path: Path) -> None:
    """One run without recorded models (named after its candidates), one with two models."""
    unnamed = [replace(v, model=None) for v in SAMPLE[:4]]
    first = write_run(tmp_path / "one", unnamed, candidates="some/dir/gpt-x")
    second = write_run(tmp_path / "two", SAMPLE[4:])
    written = write_report([str(first), str(second)], "html", str(tmp_path / "both.html"))
    assert written.runs == 2 and written.verdicts == len(SAMPLE)
    page = parse(written.path.read_text())
    models = [b.find("td").text() for b in page.by_id("leaderboard-table").find_all("tbody")]  # no nested tables
    assert sorted(models) == ["gpt-x", "model-a", "model-b"]
    assert plots_of(page)["memory"].attrs["data-series"] == "2"  # relu_cpp as gpt-x, gemm_slow as model-b
    assert len(pair_bodies(page)) == len(SAMPLE)


def test_without_matplotlib_the_message_names_the_extra(sample_run: Path, monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(UsageError, match=r"pip install 'kernelbench-verified\[report\]'"):
        write_report([str(sample_run)], "html", str(tmp_path / "r.html"))
    assert not (tmp_path / "r.html").exists()


def test_the_same_run_gives_the_same_plots(sample_run: Path, tmp_path: Path) -> None:
    first = write_report([str(sample_run)], "html", str(tmp_path / "a.html")).path.read_text()
    second = write_report([str(sample_run)], "html", str(tmp_path / "b.html")).path.read_text()
    assert [f.find("svg").text() for f in plots_of(parse(first)).values()] == \
        [f.find("svg").text() for f in plots_of(parse(second)).values()]


def test_a_skipped_pair_is_listed_but_not_counted(sample_html: str) -> None:
    page = parse(sample_html)
    statuses = [b.find("tr").find_all("td")[5] for b in pair_bodies(page)]
    skipped = [s for s in statuses if s.text() == Status.SKIPPED.value]
    assert len(skipped) == 1 and skipped[0].has_class("status-skipped")
    assert verdict("L1/x", "c", "standard", Status.SKIPPED).status.counted is False
