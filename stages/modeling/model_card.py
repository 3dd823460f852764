"""A trained checkpoint's README.md: what it is, how it scored, how it was made, how to cite.

Hugging Face model-card front matter (library, tags, base model) on top; then the objective and
its hyperparameters, the dev (STS-B, model selection) and test scores (SentEval / MTEB, when the
evaluations have run: ``cse export`` fills them in), the resolved params, the
environment, loading snippets and citations.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from stages.core.schema.objective_settings import SETTINGS_BY_NAME
from stages.core.schema.temperature_settings import CONSTANT, SCHEDULES

SIMCSE = (
    "Gao, Yao and Chen (2021). SimCSE: Simple Contrastive Learning of Sentence Embeddings. EMNLP."
)


def citations(objective: dict[str, Any], temperature: dict[str, Any] | None) -> list[str]:
    """SimCSE, the objective's paper (its settings' ``paper``) and the temperature schedule's
    (``Schedule.paper``), as a run's config.json records the objective and schedule."""
    settings = SETTINGS_BY_NAME.get(str(objective.get("name")))
    schedule = SCHEDULES.get(str((temperature or {}).get("schedule", CONSTANT)))
    papers = [SIMCSE, settings.paper if settings else "", schedule.paper if schedule else ""]
    return [paper for paper in papers if paper]


def hub_model_id(backbone: dict[str, Any]) -> bool:
    """Whether the backbone is a pretrained Hub model (the Hub checks ``base_model``)."""
    model = str(backbone.get("model") or "")
    return bool(model) and not (
        model.startswith("package:") or backbone.get("random_init") or Path(model).exists()
    )


def corpus_description(config: dict[str, Any]) -> str:
    """What the run trained on, as its config.json records it: '3,200 sentences (the first 3,200
    lines of wiki1m_head_11913)'."""
    corpus = config.get("identity", {}).get("corpus", {})
    name = corpus.get("corpus") or Path(str(config.get("corpus", "the corpus"))).stem
    rows = config.get("execution", {}).get("corpus_rows")
    first = corpus.get("max_sentences")
    where = f"the first {first:,} lines of {name}" if first else name
    return f"{rows:,} sentences ({where})" if rows is not None else f"the sentences of {where}"


def _scores_table(rows: list[tuple[str, float]], header: str) -> list[str]:
    lines = [f"| {header} | score |", "|---|---:|"]
    lines += [f"| {name} | {value:.2f} |" for name, value in rows]
    return lines


def test_score_rows(senteval: dict[str, Any] | None, mteb: dict[str, Any] | None) -> list:
    """(task, score) rows from the SentEval and MTEB result files, averages first."""
    rows: list[tuple[str, float]] = []
    summary = (senteval or {}).get("summary", {})
    if "sts_avg" in summary:
        rows.append(("SentEval STS avg (Spearman x100)", summary["sts_avg"]))
    if "transfer_avg" in summary:
        rows.append(("SentEval transfer avg (accuracy)", summary["transfer_avg"]))
    rows += [(f"SentEval {t} (Spearman)", v) for t, v in summary.get("sts", {}).items()]
    rows += [(f"SentEval {t} (accuracy)", v) for t, v in summary.get("transfer", {}).items()]
    if mteb and "average" in mteb:
        rows.append(("MTEB average (main score)", mteb["average"]))
    rows += [(f"MTEB {t}", e["main_score"]) for t, e in (mteb or {}).get("tasks", {}).items()]
    return rows


def render_model_card(
    config: dict[str, Any],
    metrics: dict[str, Any],
    *,
    senteval: dict[str, Any] | None = None,
    mteb: dict[str, Any] | None = None,
) -> str:
    """README.md for a checkpoint of the run described by ``config`` (the run's config.json)."""
    settings = config.get("settings", {})
    objective = settings.get("objective", {})
    name = objective.get("name", "unknown")
    train = settings.get("train", {})
    backbone = config.get("backbone_spec", {})
    front: dict[str, Any] = {
        "library_name": "sentence-transformers",
        "pipeline_tag": "sentence-similarity",
        "tags": ["sentence-transformers", "sentence-similarity", "feature-extraction", name],
    }
    if hub_model_id(backbone):
        front["base_model"] = backbone["model"]
    best, final = metrics.get("best", {}), metrics.get("final", {})
    lines = ["---", yaml.safe_dump(front, sort_keys=False).strip(), "---", ""]
    lines += [
        f"# {config.get('experiment', config.get('run_id', 'checkpoint'))}",
        "",
        f"Unsupervised SimCSE-style training on {corpus_description(config)} with the `{name}` "
        "objective on "
        f"`{config.get('backbone', backbone.get('model'))}` (seed {config.get('seed')}), "
        f"by cse-repro (run id `{config.get('run_id')}`). "
        f"Sentence vector: `{train.get('eval_pooler')}` (the evaluation pooler; "
        "sentence-transformers and transformers both load this folder).",
        "",
        "## Objective",
        "",
        "```json",
        json.dumps({"objective": objective, "temperature": settings.get("temperature")}, indent=2),
        "```",
        "",
        "## Scores",
        "",
        "Dev (STS-B dev Spearman x100, model selection): "
        f"best {best.get('spearman', float('nan')):.2f} at step {best.get('step')}; "
        f"final {final.get('spearman', float('nan')):.2f} "
        f"after {metrics.get('steps')} steps.",
        "",
    ]
    tests = test_score_rows(senteval, mteb)
    if tests:
        lines += ["Test (the `best` checkpoint):", "", *_scores_table(tests, "task"), ""]
    else:
        lines += [
            "Test: none here (the evaluation stages score the `best` checkpoint; "
            "`cse export` adds their SentEval and MTEB scores).",
            "",
        ]
    execution = config.get("execution", {})
    lines += [
        "## Training parameters",
        "",
        "```json",
        json.dumps(train, indent=2),
        "```",
        "",
        "## Environment",
        "",
        *[f"- {key}: {value}" for key, value in execution.items()],
        "",
        "## Usage",
        "",
        "```python",
        "from sentence_transformers import SentenceTransformer",
        "model = SentenceTransformer('path/to/this/folder')",
        "vectors = model.encode(['A sentence.', 'Another one.'])",
        "```",
        "",
        "## Citation",
        "",
        *[f"- {paper}" for paper in citations(objective, settings.get("temperature"))],
    ]
    return "\n".join(lines) + "\n"
