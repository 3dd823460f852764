"""The package's shape: a torch-free core, layers with no import pointing back up
(pyproject.toml's import-linter contract) and no import cycles anywhere in ``stages``."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import grimp

from stages.core.schema.evaluation_settings import EVALUATIONS

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "datasets", "mteb", "numpy", "polars", "scipy", "sklearn")
CORE_ENTRY_POINTS = (
    "stages.core.schema.params", "stages.core.identity.experiments", "stages.core.planning.jobs",
    "stages.core.planning.estimates", "stages.core.planning.status", "stages.core.identity.code",
    "stages.core.identity.environment", "stages.core.errors", "stages.core.storage.layout",
    "stages.commands.pipeline", "stages.commands.__main__",
)  # fmt: skip


def test_the_core_imports_no_heavy_package() -> None:
    """Importing the core, loading params and building the whole job graph (ids, code
    fingerprints, estimates) leaves torch, transformers, datasets, mteb and numpy unimported."""
    script = (
        "import sys, json\n"
        + "".join(f"import {m}\n" for m in CORE_ENTRY_POINTS)
        + "from stages.core.schema.params import load_params\n"
        "from stages.core.planning.jobs import build_jobs\n"
        "from stages.core.planning.estimates import dry_run\n"
        "from stages.core.planning.status import status_rows\n"
        "from stages.core.identity.experiments import plan_experiments\n"
        "for f in ('params.yaml', 'presets/smoke.yaml', 'presets/simace.yaml'):\n"
        "    p = plan_experiments(load_params(f))\n"
        "    build_jobs(p, f); dry_run(p, f); status_rows(p)\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert json.loads(result.stdout) == []


def test_no_module_of_the_package_imports_the_benchmarks() -> None:
    """benchmarks/ is not in the installed package: it may import stages, never the reverse
    (the rates file, not the benchmark records, is what the estimates read)."""
    importers = []
    for path in sorted((REPO / "stages").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [alias.name for alias in node.names] if isinstance(node, ast.Import)
                else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )  # fmt: skip
            if any(name.split(".")[0] == "benchmarks" for name in names):
                importers.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert importers == []


def test_no_import_points_back_up_the_layers() -> None:
    result = subprocess.run(
        [Path(sys.executable).with_name("lint-imports"), "--no-cache"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert "0 broken" in result.stdout


def test_no_import_cycles_in_stages() -> None:
    graph = grimp.build_graph("stages", cache_dir=None)
    cycles = []
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back:
                cycles.append(" -> ".join([importer, *back]))
    assert cycles == []


STAGE_ENTRY_POINTS = (
    "stages.train", *(evaluation.module for evaluation in EVALUATIONS.values()),
    "stages.evaluations.results",
)  # fmt: skip


def test_a_stage_imports_torch_only_when_it_computes() -> None:
    """A stage whose result is stored answers from the store: its module (and the shared
    evaluation glue up to the reuse check) imports no torch, transformers or mteb."""
    script = (
        "import sys, json\n"
        + "".join(f"import {m}\n" for m in STAGE_ENTRY_POINTS)
        + f"print(json.dumps(sorted(m for m in {HEAVY[:4]!r} if m in sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert json.loads(result.stdout) == []
