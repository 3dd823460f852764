"""Read whatever the pipeline has finished into tidy polars frames; never fail on a missing run.

Every planned experiment (params' matrix and baselines) gets a status row saying which of its
outputs exist; a file that is absent or unreadable is marked, not raised. Results become one
row per experiment x task x metric, with the run's identity (run id, method, backbone, seed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from stages.core.identity.experiments import Plan, plan_experiments
from stages.core.planning.status import recorded_output
from stages.core.schema.evaluation_settings import STSB_DEV_TASK
from stages.core.schema.params import Params
from stages.core.storage import layout
from stages.core.storage.run_folders import origin_label
from stages.senteval_protocol.cache import EmbeddingCache
from stages.senteval_protocol.loaders import (
    DataFormatError,
    StsTask,
    TransferTask,
    downstream_dir,
    load_task,
)
from stages.senteval_protocol.sts import ALIGNMENT_THRESHOLD

RESULT_SCHEMA = {
    "experiment": pl.String,
    "kind": pl.String,  # run | baseline
    "run_id": pl.String,
    "method": pl.String,
    "backbone": pl.String,
    "seed": pl.Int64,
    "source": pl.String,  # train | a registered evaluation (stages.core.schema.evaluation_settings)
    "task": pl.String,
    "metric": pl.String,
    "value": pl.Float64,
}
CURVE_FILES = {"steps": layout.train_steps_file, "dev": layout.dev_curve_file}
# Paper 003 Fig. 3a's x axis, the final d_ij: the mean of the last steps' logged batch gaps
# (``batch_euclidean_gap``, its Fig. 3 caption's definition; one batch's alone is noisy).
FINAL_GAP_STEPS = 100


@dataclass(frozen=True)
class Planned:
    """One planned experiment and what identifies it in the tables."""

    experiment: str
    kind: str
    method: str
    backbone: str
    seed: int | None
    run_id: str | None
    settings: dict[str, Any]  # resolved objective / temperature / train, flattened
    method_key: str  # the name the papers' numbers are filed under (params' method_key)
    sweep: str | None = None  # the published sweep point the method declares, if any


@dataclass
class Collected:
    planned: list[Planned]
    results: pl.DataFrame
    status: pl.DataFrame
    curves: dict[str, dict[str, pl.DataFrame]] = field(default_factory=dict)
    encoders: dict[str, str] = field(default_factory=dict)  # experiment -> encoder fingerprint
    # SentEval transfer task -> accuracy (%) of always predicting its most frequent class
    majority: dict[str, float] = field(default_factory=dict)


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def planned_experiments(plan: Plan) -> list[Planned]:
    """The plan's runs, then its baselines, as the tables identify them."""
    params = plan.params
    planned = [
        Planned(
            name,
            "run",
            run.method,
            run.backbone,
            run.seed,
            run.run_id,
            flatten(run.settings.model_dump(mode="json")),
            params.method_key(run.method),
            params.methods[run.method].sweep,
        )
        for name, run in plan.runs.items()
    ]
    for name, baseline in plan.baselines.items():
        settings = flatten(baseline.spec.model_dump(mode="json"))
        planned.append(
            Planned(name, "baseline", name, baseline.backbone, None, None, settings, name)
        )
    return planned


def environment_label(execution: dict[str, Any]) -> str:
    """What a run was computed with: 'torch 2.13.0, transformers 4.57.1, cpu bf16'."""
    if not execution:
        return "unknown"
    return (
        f"torch {execution.get('torch')}, transformers {execution.get('transformers')}, "
        f"{execution.get('device')} {execution.get('precision')}"
    )


def train_rows(pointer: dict[str, Any]) -> list[tuple[str, str, float]]:
    rows = [(STSB_DEV_TASK, "best_spearman", pointer.get("best_dev_spearman"))]
    rows += [("training", key, pointer.get(key)) for key in ("best_step", "steps", "wall_time_s")]
    return [r for r in rows if isinstance(r[2], int | float)]


def senteval_rows(result: dict[str, Any]) -> list[tuple[str, str, float]]:
    summary = result.get("summary", {})
    rows = [(task, "spearman", v) for task, v in summary.get("sts", {}).items()]
    if "sts_avg" in summary:
        rows.append(("STS_avg", "spearman", summary["sts_avg"]))
    rows += [(task, "accuracy", v) for task, v in summary.get("transfer", {}).items()]
    if "transfer_avg" in summary:
        rows.append(("TR_avg", "accuracy", summary["transfer_avg"]))
    geometry = result.get("alignment_uniformity", {})
    rows += [(STSB_DEV_TASK, k, geometry[k]) for k in ("alignment", "uniformity") if k in geometry]
    return rows


def mteb_rows(result: dict[str, Any]) -> list[tuple[str, str, float]]:
    metric = "mteb_main_score"
    rows = [(task, metric, entry["main_score"]) for task, entry in result.get("tasks", {}).items()]
    rows += [(f"MTEB_{c}", metric, e["mean"]) for c, e in result.get("categories", {}).items()]
    if "average" in result:
        rows.append(("MTEB_avg", metric, result["average"]))
    return rows


def final_gap(steps: pl.DataFrame | None) -> float | None:
    """The final d_ij of paper 003's Fig. 3 (mean_i [mean_j ||h_i - h'_j|| - ||h_i - h'_i||] of
    a training batch): the mean over the last ``FINAL_GAP_STEPS`` logged steps; None when the
    run's steps did not log it."""
    column = "batch_euclidean_gap"
    if steps is None or column not in steps.columns:
        return None
    gaps = steps.sort("step")[column].drop_nulls()
    return float(gaps.tail(FINAL_GAP_STEPS).mean()) if gaps.len() else None


def curve_rows(curves: dict[str, pl.DataFrame]) -> list[tuple[str, str, float]]:
    """Means over training steps of the batch angles (SimACE Figs. 4 and 7 captions), and the
    final batch gap d_ij (paper 003 Fig. 3a)."""
    steps = curves.get("steps")
    rows = []
    for column, metric in (
        ("batch_pos_angle_deg", "positive_angle_deg"),
        ("batch_neg_angle_deg", "negative_angle_deg"),
    ):
        if steps is not None and column in steps.columns and steps[column].drop_nulls().len():
            rows.append(("train_batch", metric, float(steps[column].drop_nulls().mean())))
    gap = final_gap(steps)
    if gap is not None:
        rows.append(("train_batch", "final_euclidean_gap", gap))
    return rows


def score_rows(result: dict[str, Any]) -> list[tuple[str, str, float]]:
    """A registered evaluation's ``scores``: {task: {metric: value}} (docs/extending.md)."""
    return [
        (task, metric, value)
        for task, metrics in result.get("scores", {}).items()
        for metric, value in metrics.items()
    ]


# The result files whose layout predates the registry; every other evaluation writes `scores`.
READERS = {"train": train_rows, "senteval": senteval_rows, "mteb": mteb_rows}


def read_curves(experiment: str, root: Path) -> dict[str, pl.DataFrame]:
    curves = {}
    for kind, path_of in CURVE_FILES.items():
        path = root / path_of(experiment)
        if path.is_file() and path.stat().st_size > 1:
            try:
                curves[kind] = pl.read_csv(path, infer_schema_length=None)
            except (OSError, pl.exceptions.PolarsError):
                continue
    return curves


def is_planned(params: Params, entry: Planned, source: str) -> bool:
    """Whether the experiment has output ``source``: training for runs only, each evaluation
    where it is enabled."""
    if source == "train":
        return entry.kind == "run"
    method = entry.method if entry.kind == "run" else None
    return params.evaluation_settings(source, method).is_enabled()


def scored_labels(task: TransferTask) -> np.ndarray:
    """The labels a transfer task's accuracy is computed over (``stages.senteval_protocol
    .transfer``): every sample of a cross-validated task (MR, CR, SUBJ, MPQA), the test split of
    the others (SST2, TREC, MRPC)."""
    return task.splits["all" if "all" in task.splits else "test"].labels


def majority_rate(labels: np.ndarray) -> float:
    """Accuracy (%) of always predicting the most frequent of ``labels``, to SentEval's two
    decimals, so that a classifier that learned nothing scores exactly this."""
    counts = np.bincount(labels)
    return round(100 * float(counts.max()) / float(counts.sum()), 2)


def majority_rates(data_dir: Path, tasks: list[str]) -> dict[str, float]:
    """The majority-class rate of each transfer task among ``tasks`` whose data is under the
    SentEval root ``data_dir``; the tasks it cannot read are left out."""
    try:
        downstream = downstream_dir(data_dir)
    except DataFormatError:
        return {}
    rates = {}
    for name in tasks:
        try:
            task = load_task(downstream, name)
        except (OSError, ValueError):  # DataFormatError is a ValueError
            continue
        if isinstance(task, TransferTask):
            rates[name] = majority_rate(scored_labels(task))
    return rates


def collect(params: Params, root: Path = Path(".")) -> Collected:
    """Everything finished under ``root`` for the planned experiments of ``params``."""
    plan = plan_experiments(params)
    planned = planned_experiments(plan)
    rows: list[dict[str, Any]] = []
    status: list[dict[str, Any]] = []
    collected = Collected(planned, pl.DataFrame(schema=RESULT_SCHEMA), pl.DataFrame())
    for entry in planned:
        identity = {
            "experiment": entry.experiment,
            "kind": entry.kind,
            "run_id": entry.run_id,
            "method": entry.method,
            "backbone": entry.backbone,
            "seed": entry.seed,
        }
        state: dict[str, Any] = {**identity}
        for source in ("train", *params.planned_evaluations()):
            if not is_planned(params, entry, source):
                state[source] = "n/a"
                continue
            experiment = plan.experiment(entry.experiment)
            data, problem = recorded_output(plan, source, experiment, root)
            state[source] = problem or "done"
            if data is not None and source == "train":
                state["environment"] = environment_label(data.get("environment", {}))
                state["origin"] = origin_label(data.get("origin", {}))
            if problem is not None:
                continue
            for task, metric, value in READERS.get(source, score_rows)(data):
                rows.append(
                    {
                        **identity,
                        "source": source,
                        "task": task,
                        "metric": metric,
                        "value": float(value),
                    }
                )
            fingerprint = (
                data.get("encoder", {}).get("fingerprint") if source == "senteval" else None
            )
            if fingerprint:
                collected.encoders[entry.experiment] = fingerprint
            if source == "senteval":
                for task, result in data.get("tasks", {}).items():
                    if "majority_acc" in result:
                        collected.majority[task] = result["majority_acc"]
        if state.get("train") == "done":
            curves = read_curves(entry.experiment, root)
            collected.curves[entry.experiment] = curves
            for task, metric, value in curve_rows(curves):
                rows.append(
                    {**identity, "source": "train", "task": task, "metric": metric, "value": value}
                )
        status.append(state)
    collected.results = pl.DataFrame(rows, schema=RESULT_SCHEMA)
    collected.status = pl.DataFrame(status, infer_schema_length=None)
    # From the data the report's params name; the rate an evaluation recorded (majority_acc)
    # stands in where that data is not on this machine.
    scored = collected.results.filter(pl.col("metric") == "accuracy")["task"].unique().sort()
    data_dir = root / params.evaluations.senteval.data_dir
    collected.majority |= majority_rates(data_dir, scored.to_list())
    return collected


def stsb_dev_angles(
    data_dir: Path, cache_root: Path, fingerprint: str
) -> dict[str, np.ndarray] | None:
    """Angles (degrees) between the final model's embeddings of STS-B dev pairs, read from the
    SentEval stage's embedding cache: positives are the pairs with gold > 4 (SimCSE's p_pos,
    as for alignment), negatives every first sentence with every other pair's second sentence
    (the in-batch-negative construction). None when the data or the cache entry is absent."""
    try:
        task = load_task(downstream_dir(data_dir), "STSBenchmark")
    except (OSError, ValueError):
        return None
    distinct = sorted(set(task.texts))
    stored = EmbeddingCache(cache_root, fingerprint).load("STSBenchmark", distinct)
    if stored is None or not isinstance(task, StsTask):
        return None
    row = {text: i for i, text in enumerate(distinct)}
    dev = next(p for p in task.parts if p.name == "dev")
    a = stored[[row[t] for t in dev.sent1]].astype(np.float64)
    b = stored[[row[t] for t in dev.sent2]].astype(np.float64)
    a /= np.linalg.norm(a, axis=1, keepdims=True)
    b /= np.linalg.norm(b, axis=1, keepdims=True)
    degrees = np.degrees(np.arccos(np.clip(a @ b.T, -1.0, 1.0)))
    positive = np.diagonal(degrees)[dev.scores > ALIGNMENT_THRESHOLD]
    negative = degrees[~np.eye(len(degrees), dtype=bool)]
    return {"positive": positive, "negative": negative}
