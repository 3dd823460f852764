"""Live training metrics for the researcher's tools: DVCLive, TensorBoard, Weights & Biases.

Every record the run writes to ``log.jsonl`` (one per optimizer step: loss, tau, lr, grad_norm,
the objective's statistics; one per dev evaluation) also goes to the loggers that
``train.loggers`` names, on rank 0 only:

- ``dvclive``: ``<live>/dvclive/`` (plots/metrics/{train,dev}/*.tsv, metrics.json) and a
  ``dvc.yaml`` declaring them, so ``dvc plots show`` and ``dvc exp show`` see the run while it
  trains and across experiments;
- ``tensorboard``: event files in ``<live>/tensorboard/`` (``tensorboard --logdir``);
- ``wandb``: a Weights & Biases run, only if ``wandb`` is installed (else a warning); its own
  settings apply (``WANDB_MODE=offline`` keeps it offline, ``WANDB_PROJECT`` names the project).

The loggers only watch: they are not part of a run's identity, and a resumed run replays the
kept part of ``log.jsonl`` into fresh loggers, so they always show exactly the log.
"""

from __future__ import annotations

import importlib.util
import math
import shutil
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from stages.core.storage.run_folders import read_log
from stages.training.records import JsonlLog

LOGGERS = ("dvclive", "tensorboard", "wandb")
_SKIP = {"event", "step", "best", "eval_s", "epoch"}
_PREFIX = {"train": "train", "eval": "dev"}


class MetricsLogger(Protocol):
    def log(self, step: int, scalars: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def scalars_of(record: dict[str, Any]) -> tuple[int, dict[str, float]] | None:
    """(step, {"train/loss": ..., "dev/spearman": ...}) of a log record; None for other events."""
    prefix = _PREFIX.get(record.get("event", ""))
    if prefix is None:
        return None
    values = {
        f"{prefix}/{key}": float(value)
        for key, value in record.items()
        if key not in _SKIP and isinstance(value, int | float) and not isinstance(value, bool)
    }
    return int(record["step"]), values


class DvcLiveLogger:
    def __init__(self, folder: Path) -> None:
        from dvclive import Live

        self.live = Live(
            dir=str(folder / "dvclive"),
            dvcyaml=str(folder / "dvc.yaml"),
            save_dvc_exp=False,
            report=None,
        )

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.live.step = step
        for name, value in scalars.items():
            if math.isfinite(value):
                self.live.log_metric(name, value)
        self.live.next_step()

    def close(self) -> None:
        self.live.end()


class TensorBoardLogger:
    def __init__(self, folder: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(folder / "tensorboard"))

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for name, value in scalars.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    def __init__(self, folder: Path, run_name: str, config: dict[str, Any]) -> None:
        import wandb

        self.run = wandb.init(name=run_name, dir=str(folder), config=config, reinit=True)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


def _create(name: str, folder: Path, run_name: str, config: dict[str, Any]) -> MetricsLogger | None:
    if name == "dvclive":
        return DvcLiveLogger(folder)
    if name == "tensorboard":
        return TensorBoardLogger(folder)
    if name == "wandb":
        if importlib.util.find_spec("wandb") is None:
            warnings.warn("train.loggers: wandb is not installed, skipped", stacklevel=3)
            return None
        return WandbLogger(folder, run_name, config)
    raise ValueError(f"unknown logger '{name}'; allowed: {', '.join(LOGGERS)}")


def open_loggers(
    names: Sequence[str], folder: Path, run_name: str, config: dict[str, Any] | None = None
) -> list[MetricsLogger]:
    """Fresh loggers writing under ``folder`` (emptied first). A logger that fails to start is
    left out with a warning: watching a run must never stop it."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    loggers: list[MetricsLogger] = []
    for name in names:
        try:
            logger = _create(name, folder, run_name, config or {})
        except ValueError:
            raise
        except Exception as err:  # e.g. dvclive in a git repository without commits
            warnings.warn(f"train.loggers: {name} could not start, skipped: {err}", stacklevel=2)
            continue
        if logger is not None:
            loggers.append(logger)
    return loggers


class RunLog:
    """log.jsonl plus the live loggers: the loop writes records here, as to a JsonlLog."""

    def __init__(self, jsonl: JsonlLog, loggers: Sequence[MetricsLogger] = ()) -> None:
        self.jsonl, self.loggers = jsonl, list(loggers)

    @property
    def offset(self) -> int:
        return self.jsonl.offset

    def sync(self) -> None:
        self.jsonl.sync()

    def write(self, records: list[dict[str, Any]]) -> None:
        self.jsonl.write(records)
        self.publish(records)

    def publish(self, records: list[dict[str, Any]]) -> None:
        points = [p for p in map(scalars_of, records) if p is not None]
        for logger in list(self.loggers):
            try:
                for point in points:
                    logger.log(*point)
            except Exception as err:  # a logger that fails is dropped, the run goes on
                warnings.warn(f"{type(logger).__name__} failed and stops: {err}", stacklevel=2)
                self.loggers.remove(logger)

    def close(self) -> None:
        self.jsonl.close()
        for logger in self.loggers:
            try:
                logger.close()
            except Exception as err:
                warnings.warn(f"{type(logger).__name__} failed to close: {err}", stacklevel=2)


def open_run_log(
    path: Path,
    truncate_at: int,
    loggers: Sequence[str],
    live_dir: Path | None,
    run_name: str,
    config: dict[str, Any] | None = None,
) -> RunLog:
    """The run's log, cut back to ``truncate_at`` bytes; the loggers replay what is kept."""
    log = RunLog(JsonlLog(path, truncate_at=truncate_at))
    if live_dir is None or not loggers:
        return log
    log.loggers = open_loggers(loggers, live_dir, run_name, config)
    if truncate_at:
        log.publish(read_log(path))
    return log
