"""One registry of figures: the report shows every registered figure whose data exist, the
report's and the figures stage's, each under its title with its caption, and nothing else; the
figures stage writes exactly its registered figures; docs/figures.md's worked example of adding
a figure (one function, one entry) works as it says."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from test_report import built, params, project  # noqa: F401  (the report fixtures)

from stages.core.errors import StageError
from stages.core.schema.params import Params
from stages.core.storage import layout
from stages.report import build_report
from stages.reporting import plots, registry
from stages.reporting.plots import Plot, save

REPO = Path(__file__).resolve().parents[2]
CODE_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def figure_sections(text: str) -> list[tuple[str, str]]:
    """(title, caption) of every figure in report.html, in page order."""
    found = re.findall(r"<figure><h3>(.*?)</h3><img [^>]*><figcaption>(.*?)</figcaption>", text)
    return [(html.unescape(t), html.unescape(c)) for t, c in found]


def test_the_registry_names_each_figure_once_with_a_title_and_its_data() -> None:
    names = [figure.name for figure in registry.FIGURES]
    assert len(names) == len(set(names))
    for figure in registry.FIGURES:
        assert figure.title and figure.reads and figure.stage in {"report", "figures"}
    analyses = [f.name for f in registry.drawn_by("figures")]
    assert analyses == [
        "gradient_dissipation", "hardest_negative_share", "dynamic_ratio",
        "alignment_gradient_norms", "uniformity_gradient_norms", "gradient_norm_curves",
    ]  # fmt: skip
    assert all(f.paper[:3] in {"002", "003"} for f in registry.drawn_by("figures"))


def test_the_report_shows_every_report_figure_under_its_registered_title(
    built,  # noqa: F811
    project: Path,  # noqa: F811
) -> None:
    out = project / "reports/results"
    page, md = (out / "report.html").read_text(), (out / "report.md").read_text()
    shown = figure_sections(page)
    titles = {f.name: f.heading for f in registry.FIGURES}
    pngs = sorted((out / "figures").glob("*.png"))
    assert len(shown) == len(pngs) == page.count("data:image/png;base64,")
    assert {t for t, _ in shown} <= set(titles.values())
    assert titles["final_gap_sweep"].endswith("(paper 003, Fig. 3a)")
    for name in ("summary_forest", "training_curves", "alignment_uniformity", "batch_angles"):
        assert titles[name] in {t for t, _ in shown}, name
        assert f"### {titles[name]}\n\n![{titles[name]}](figures/{name}.png)" in md
    # every caption under its figure, as the figure's function wrote it
    assert all(caption for _, caption in shown)
    (sweep,) = [c for t, c in shown if t == titles["sweeps"]]
    assert sweep.startswith("STS avg. against objective.tau")


def analyses_folder(root: Path) -> dict[str, str]:
    """A figures-stage output under ``root``: every registered analysis as a small PNG with a
    caption of its own, plus an unregistered PNG. Returns name -> caption."""
    folder = root / layout.analyses_dir()
    folder.mkdir(parents=True)
    captions = {}
    for figure in registry.drawn_by("figures"):
        fig, ax = plt.subplots(figsize=(2, 1))
        ax.plot([0, 1], [0, 1])
        save(Plot(figure.name, "", fig), folder)
        captions[figure.name] = f"caption of {figure.name} as the stage wrote it"
    fig, _ = plt.subplots(figsize=(2, 1))
    save(Plot("stray", "", fig), folder)
    entries = [{"name": n, "title": "old title", "caption": c} for n, c in captions.items()]
    (folder / "index.json").write_text(json.dumps({"figures": entries}))
    return captions


def test_the_report_embeds_the_figures_stages_figures_with_their_titles_and_captions(
    params: Params,  # noqa: F811
    tmp_path: Path,
) -> None:
    captions = analyses_folder(tmp_path)
    build_report(params, tmp_path)
    out = tmp_path / "reports/results"
    page, md = (out / "report.html").read_text(), (out / "report.md").read_text()
    expected = [(f.heading, captions[f.name]) for f in registry.drawn_by("figures")]
    shown = figure_sections(page)
    # the registry's titles, in its order, after the report's own (a sweep with no run yet)
    assert shown[-len(expected) :] == expected and len(shown) == len(expected) + 1
    assert page.count("data:image/png;base64,") == len(shown)
    for figure in registry.drawn_by("figures"):
        link = f"![{figure.heading}](../analyses/{figure.name}.png)\n\n{captions[figure.name]}\n"
        assert link in md
    assert "stray" not in md and "stray" not in page
    # the links resolve from the report's folder
    for target in re.findall(r"\]\((\.\./analyses/[^)]+)\)", md):
        assert (out / target).is_file()


def test_a_damaged_analyses_index_is_named(params: Params, tmp_path: Path) -> None:  # noqa: F811
    analyses_folder(tmp_path)
    index = tmp_path / layout.analyses_dir() / "index.json"
    index.write_text('{"figures": [{"name": "dynamic_ratio"}]}')
    with pytest.raises(StageError, match=r"analyses/index\.json: not an index written by"):
        build_report(params, tmp_path)
    assert not (tmp_path / "reports/results").exists()  # nothing half-written


def test_a_registered_analysis_the_stage_has_not_written_is_left_out(
    params: Params,  # noqa: F811
    tmp_path: Path,
) -> None:
    captions = analyses_folder(tmp_path)
    (tmp_path / layout.analyses_dir() / "dynamic_ratio.png").unlink()
    build_report(params, tmp_path)
    shown = figure_sections((tmp_path / "reports/results/report.html").read_text())
    assert [c for _, c in shown[1:]] == [c for n, c in captions.items() if n != "dynamic_ratio"]


def test_the_worked_example_of_adding_a_figure_runs(
    params: Params,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docs/figures.md, "Adding a figure": its function, run as part of plots.py, and its
    entry, added to the registry, give the report one more figure under its title."""
    doc = (REPO / "docs/figures.md").read_text(encoding="utf-8")
    section = doc[doc.index("## Adding a figure") : doc.index("## The analyses that need")]
    function, entry = CODE_BLOCK.findall(section)
    in_plots = dict(vars(plots))
    exec(function, in_plots)
    monkeypatch.setattr(plots, "finished_outputs", in_plots["finished_outputs"], raising=False)
    (added,) = eval(entry, dict(vars(registry)))
    monkeypatch.setattr(registry, "FIGURES", (*registry.FIGURES, added))

    build_report(params, tmp_path)
    out = tmp_path / "reports/results"
    assert (out / "figures/finished_outputs.png").is_file()
    shown = dict(figure_sections((out / "report.html").read_text()))
    assert shown["Finished outputs per stage"].startswith("Planned experiments with each output")
    assert (
        "![Finished outputs per stage](figures/finished_outputs.png)"
        in (out / "report.md").read_text()
    )


def test_the_docs_describe_every_registered_figure() -> None:
    """docs/report.md's figure table has a row per report figure (the sweeps as their family),
    docs/figures.md a section per analysis."""
    report_doc = (REPO / "docs/report.md").read_text(encoding="utf-8")
    table = report_doc[report_doc.index("\n## Figures\n") :]
    figures_doc = (REPO / "docs/figures.md").read_text(encoding="utf-8")
    for figure in registry.FIGURES:
        if figure.stage == "figures":
            assert f"\n#### `{figure.name}`" in figures_doc, figure.name
        elif figure.name == "sweeps":
            assert "| `sweep_<section>_<key>.png` |" in table
        elif figure.section == "figures":
            assert f"| `{figure.name}.png` |" in table, figure.name
        else:
            assert f"`figures/{figure.name}.png`" in report_doc, figure.name


def test_the_report_imports_no_torch() -> None:
    """The registry names the analyses' functions, which compute with the objectives; the
    report only embeds their PNGs, so importing it (and the registry) leaves torch out."""
    script = "import sys, stages.report, stages.reporting.registry; print('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"
