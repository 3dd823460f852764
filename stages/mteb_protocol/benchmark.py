"""``evaluate_mteb``: run mteb on a wrapped encoder, task by task, and summarise the results.

For each task, in order:

1. Data. With local data enabled and a local copy present (``local_data.py``), the task is fed
   from it: its ``dataset`` is set and marked loaded (mteb then neither downloads nor unloads it)
   and its metadata's dataset revision becomes the local copy's checksum, so results computed on
   local text are never confused with hub results. Otherwise the hub dataset is loaded through
   mteb (which uses the local Hugging Face cache under ``HF_HUB_OFFLINE=1``). A task whose data
   cannot be had is skipped with the reason. Without ``HF_HUB_OFFLINE`` the hub is probed once
   (a few seconds at most) instead of letting every task spend ~25 s in download retries.
2. Cache. mteb's result cache (``cache_dir``) is keyed by model name and revision (see
   ``model.py``). A cached result is reused only when it covers the task's splits and subsets
   and was computed on the same dataset revision; then no data is loaded at all.
3. Scores. The main score (mteb's ``main_score`` metric, averaged over the task's evaluated
   splits and subsets, times 100), read back from mteb's result file (which rounds to 6 digits;
   fresh and cached results thus agree), and timings go into the summary; the result file stays
   in the cache folder and its path is recorded.

At least one task must run: if every task is skipped, ``NoTaskEvaluated`` lists the reasons.
"""

from __future__ import annotations

import logging
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from stages.core.schema.mteb_task_sets import task_names
from stages.mteb_protocol.local_data import (
    LocalPairs,
    LocalSource,
    compare_with_hub_statistics,
    load_local_pairs,
    local_root,
    local_tasks,
)
from stages.mteb_protocol.mteb_encoder import MtebEncoder
from stages.mteb_protocol.tasks import build_tasks

if TYPE_CHECKING:
    from mteb.abstasks.abstask import AbsTask
    from mteb.cache import ResultCache
    from mteb.results import TaskResult

log = logging.getLogger(__name__)
SCALE = 100.0  # mteb scores are in [0, 1]; the papers print percentages
HUB_PROBE_TIMEOUT_S = 5.0


class NoTaskEvaluated(RuntimeError):
    """Every requested task was skipped; the message lists why."""


@dataclass(frozen=True)
class LocalData:
    """Where local copies of tasks live (params.yaml mteb.local_source and the data folders)."""

    source: LocalSource
    sts_raw_dir: Path
    senteval_dir: Path


def evaluate_mteb(
    model: MtebEncoder,
    tasks: str | Sequence[str],
    *,
    cache_dir: str | Path,
    local: LocalData | None = None,
    batch_size: int = 128,
) -> dict[str, Any]:
    """Results of ``model`` on a named task set or a list of mteb task names (see module doc)."""
    import datasets.config
    from mteb.cache import ResultCache

    names = task_names(tasks)
    cache = ResultCache(Path(cache_dir))
    offline = bool(datasets.config.HF_HUB_OFFLINE)
    hub = _HubAccess(offline)
    evaluated: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    for position, task in enumerate(build_tasks(names), start=1):
        name = task.metadata.name
        pairs = _local_pairs(name, local)
        if pairs is not None:
            _attach_local(task, pairs)
        try:
            state = _cache_state(task, model, cache)
            if pairs is None and state != "complete":
                reason = hub.load(task)
                if reason is not None:
                    skipped[name] = _skip_reason(name, local, reason)
                    log.warning("[%d/%d] %s skipped: %s", position, len(names), name, skipped[name])
                    continue
            evaluated[name] = _evaluate_task(model, task, cache, batch_size, pairs, state)
        finally:
            _unload(task)
        row = evaluated[name]
        log.info(
            "[%d/%d] %s: %.2f %s (%s%s, %.1f s, %.0f texts/s)",
            position, len(names), name, row["main_score"], row["metric"], row["data"],
            ", cached" if row["from_cache"] else "", row["wall_s"], row["texts_per_s"] or 0.0,
        )  # fmt: skip
    if not evaluated:
        reasons = "\n".join(f"  - {name}: {why}" for name, why in skipped.items())
        raise NoTaskEvaluated(f"no MTEB task could be evaluated:\n{reasons}")
    return summarize(model, names, evaluated, skipped, cache.cache_path, offline, local)


def main_score(result: TaskResult, task: AbsTask) -> float:
    """mteb's main score over the task's evaluated splits and subsets, times 100 (a cached result
    may hold more subsets than the task now asks for)."""
    values = [
        entry["main_score"]
        for split in task.eval_splits
        for entry in result.scores.get(split, [])
        if entry["hf_subset"] in task.hf_subsets
    ]
    if not values:
        raise ValueError(f"{task.metadata.name}: mteb returned no score for {task.eval_splits}")
    return SCALE * float(np.mean(values))


def summarize(
    model: MtebEncoder,
    requested: Sequence[str],
    evaluated: dict[str, dict[str, Any]],
    skipped: dict[str, str],
    cache_path: Path,
    offline: bool,
    local: LocalData | None,
) -> dict[str, Any]:
    """The results JSON: per task, per category (mteb's task type) and overall means."""
    import mteb

    texts = sum(row["texts_encoded"] for row in evaluated.values())
    encode_s = sum(row["encode_s"] for row in evaluated.values())
    meta = model.mteb_model_meta
    return {
        "mteb_version": mteb.__version__,
        "encoder": model.describe(),
        "scale": "mteb main score x 100",
        **score_summary(requested, evaluated, skipped),
        "requested": list(requested),
        "evaluated": list(evaluated),
        "skipped": skipped,
        "tasks": evaluated,
        "data": {
            "hub_offline": offline,
            "local_source": local.source if local else None,
        },
        "timing": {
            "wall_s": sum(row["wall_s"] for row in evaluated.values()),
            "encode_s": encode_s,
            "texts_encoded": texts,
            "texts_per_s": texts / encode_s if encode_s > 0 else None,
        },
        "mteb_results_dir": str(cache_path / "results" / meta.model_name_as_path() / meta.revision),
    }


def score_summary(
    requested: Sequence[str], evaluated: dict[str, dict[str, Any]], skipped: dict[str, str]
) -> dict[str, Any]:
    """The means the report reads: over every evaluated task (``average``) and per category
    (mteb's task type), and whether every requested task was evaluated (``complete``)."""
    import mteb

    by_category: dict[str, list[float]] = {}
    requested_per_category: dict[str, int] = {}
    for name in requested:
        category = mteb.get_task(name).metadata.type
        requested_per_category[category] = requested_per_category.get(category, 0) + 1
        if name in evaluated:
            by_category.setdefault(category, []).append(evaluated[name]["main_score"])
    return {
        "average": float(np.mean([row["main_score"] for row in evaluated.values()])),
        "categories": {
            category: {
                "mean": float(np.mean(values)),
                "tasks": len(values),
                "requested": requested_per_category[category],
            }
            for category, values in by_category.items()
        },
        "complete": not skipped,
    }


def _local_pairs(name: str, local: LocalData | None) -> LocalPairs | None:
    if local is None:
        return None
    return load_local_pairs(name, local.source, local.sts_raw_dir, local.senteval_dir)


def _attach_local(task: AbsTask, pairs: LocalPairs) -> None:
    from datasets import Dataset, DatasetDict

    columns = {"sentence1": pairs.sentence1, "sentence2": pairs.sentence2, "score": pairs.score}
    (split,) = task.eval_splits  # MTEB's STS test sets have one split
    task.dataset = DatasetDict({split: Dataset.from_dict(columns)})
    task.data_loaded = True
    # an instance-level metadata describes this data; mteb's unload_data() drops it again
    files = ", ".join(pairs.files)
    dataset = {"path": f"local {pairs.source}: {files}", "revision": pairs.revision}
    task.metadata = task.metadata.model_copy(update={"dataset": dataset})


def _subtasks(task: AbsTask) -> list[AbsTask]:
    return list(task.metadata.tasks) if task.is_aggregate else [task]


def _unload(task: AbsTask) -> None:
    for part in _subtasks(task):
        if part.data_loaded:
            part.unload_data()


CacheState = Literal["absent", "complete", "partial", "stale"]


def _cache_state(task: AbsTask, model: MtebEncoder, cache: ResultCache) -> CacheState:
    """What mteb's cache holds for this encoder and task: nothing, all of the task's splits and
    subsets, some of them, or a result computed on another dataset revision (local vs hub)."""
    cached = cache.load_task_result(task.metadata.name, model.mteb_model_meta)
    if cached is None:
        return "absent"
    if cached.dataset_revision != task.metadata.revision:
        return "stale"
    return "partial" if cached.get_missing_evaluations(task) else "complete"


@contextmanager
def superseded_task_not_warned(task: AbsTask) -> Iterator[None]:
    """mteb warns twice per evaluation (a log line and a UserWarning) that a task has a newer
    version; the papers' tables were computed on the version asked for (STSBenchmark, not
    STSBenchmark.v2), which is the one meant. One log line says so instead, and the result
    records the newer version's name (``superseded_by``)."""
    superseded_by = task.superseded_by
    if not superseded_by:
        yield
        return
    log.info("%s: scored as asked (mteb's newer version %s is not used)", task.metadata.name,
             superseded_by)  # fmt: skip
    task_logger = logging.getLogger(type(task).check_if_dataset_is_superseded.__module__)
    quiet = _MessageFilter("is superseded by")
    task_logger.addFilter(quiet)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*is superseded by.*")
            yield
    finally:
        task_logger.removeFilter(quiet)


class _MessageFilter(logging.Filter):
    def __init__(self, fragment: str) -> None:
        super().__init__()
        self.fragment = fragment

    def filter(self, record: logging.LogRecord) -> bool:
        return self.fragment not in record.getMessage()


def _evaluate_task(
    model: MtebEncoder,
    task: AbsTask,
    cache: ResultCache,
    batch_size: int,
    pairs: LocalPairs | None,
    state: CacheState,
) -> dict[str, Any]:
    import mteb

    meta = model.mteb_model_meta
    if state == "stale":
        log.info("%s: the cached result is from other data: re-evaluating", task.metadata.name)
    texts, seconds = model.counter.texts, model.counter.seconds
    start = time.perf_counter()
    with superseded_task_not_warned(task):
        mteb.evaluate(
            model,
            task,
            cache=cache,
            overwrite_strategy="always" if state == "stale" else "only-missing",
            encode_kwargs={"batch_size": batch_size},
            co2_tracker=False,
            show_progress_bar=False,
        )
    wall = time.perf_counter() - start
    # read back what mteb stored (scores rounded to 6 digits), so that a fresh and a cached
    # evaluation report the same numbers
    result = cache.load_task_result(task.metadata.name, meta, raise_if_not_found=True)
    texts = model.counter.texts - texts
    seconds = model.counter.seconds - seconds
    row: dict[str, Any] = {
        "main_score": main_score(result, task),
        "metric": task.metadata.main_score,
        "category": task.metadata.type,
        "splits": list(task.eval_splits),
        "subsets": list(task.hf_subsets),
        "data": f"local:{pairs.source}" if pairs else "hub",
        **({"superseded_by": task.superseded_by} if task.superseded_by else {}),
        "dataset_revision": result.dataset_revision,
        "from_cache": state == "complete",
        "wall_s": wall,
        "encode_s": seconds,
        "texts_encoded": texts,
        "texts_per_s": texts / seconds if seconds > 0 else None,
        "mteb_evaluation_time_s": result.evaluation_time,
        "result_file": str(cache.get_task_result_path(task.metadata.name, meta)),
    }
    if pairs is not None:
        hub_stats = type(task).metadata.descriptive_stats or {}
        row["local_copy"] = {
            "pairs": len(pairs),
            "files": list(pairs.files),
            "sha256": pairs.sha256,
            **(
                compare_with_hub_statistics(pairs, hub_stats[task.eval_splits[0]])
                if task.eval_splits[0] in hub_stats
                else {"matches_hub_statistics": None}
            ),
        }
    return row


def _skip_reason(name: str, local: LocalData | None, hub_reason: str) -> str:
    if local is not None and name in local_tasks(local.source):
        folder = local_root(name, local.source, local.sts_raw_dir, local.senteval_dir)
        return f"no local copy ({folder} not found) and {hub_reason}"
    return hub_reason


class _HubAccess:
    """Loads hub data through mteb, turning 'no data' into a skip reason instead of an error."""

    def __init__(self, offline: bool) -> None:
        self.offline = offline
        self.unreachable: str | None = None
        self.probed = False

    def load(self, task: AbsTask) -> str | None:
        """None when the task's data is loaded, else why it cannot be."""
        if not self.offline:
            if not self.probed:
                self.unreachable = probe_hub()
                self.probed = True
            if self.unreachable is not None:
                return (
                    f"the Hugging Face hub is unreachable ({self.unreachable}); "
                    "set HF_HUB_OFFLINE=1 to use datasets already in the local HF cache"
                )
        try:
            for part in _subtasks(task):
                part.load_data()
        except OSError as err:  # connection, offline mode, dataset not found, file errors
            _unload(task)
            cause = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}"
            if self.offline:
                return f"hub data not in the local Hugging Face cache, HF_HUB_OFFLINE=1 ({cause})"
            return f"hub data unavailable ({cause})"
        return None


def probe_hub(endpoint: str | None = None, timeout: float = HUB_PROBE_TIMEOUT_S) -> str | None:
    """None if the hub answers at all (any HTTP status), else the connection error."""
    from huggingface_hub import constants

    url = endpoint or constants.ENDPOINT
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout)
    except urllib.error.HTTPError:
        return None
    except (urllib.error.URLError, OSError) as err:
        return f"{url}: {getattr(err, 'reason', err)}"
    return None
