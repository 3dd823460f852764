"""What a run reports while it trains: one JSONL line per optimizer step (loss, tau, lr, gradient
norm, the objective's statistics), one per evaluation, and the stop on a non-finite value.

Step values stay on the device and are read back together every ``log_steps`` (one host-device
sync per flush, none per step), so every step is still logged and checked for non-finite values.
A flush always precedes an evaluation and a checkpoint, so no checkpoint or best model is ever
written from weights that a non-finite step has touched.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch

from stages.core.errors import StageError
from stages.training import distributed as dist_util
from stages.training.distributed import Distributed


class NonFiniteLossError(StageError):
    """Training produced a non-finite loss or gradient; the message names step and statistic."""


@dataclass
class _Pending:
    step: int
    host: dict[str, Any]
    names: tuple[str, ...]
    values: torch.Tensor  # 1-D, on the device


class StepRecorder:
    """Collects per-step device values; ``flush`` reads them back in one transfer."""

    def __init__(self, objective_name: str) -> None:
        self.objective_name = objective_name
        self._pending: list[_Pending] = []

    @torch.no_grad()
    def record(self, step: int, device_values: dict[str, torch.Tensor], **host: Any) -> None:
        # One stack of the 0-d values (a cast only if one is not fp32): a step's records cost
        # one or two operators, not three per value.
        values = [v if v.dim() == 0 else v.reshape(()) for v in device_values.values()]
        if any(v.dtype != torch.float32 for v in values):
            values = [v.float() for v in values]
        self._pending.append(_Pending(step, host, tuple(device_values), torch.stack(values)))

    def flush(self, reduce_mean: Callable[[torch.Tensor], None] | None = None) -> list[dict]:
        """The pending steps as log records (one host-device transfer).

        ``reduce_mean`` (optional) averages the stacked values across ranks in place.
        """
        if not self._pending:
            return []
        stacked = torch.cat([p.values for p in self._pending])
        if reduce_mean is not None:
            reduce_mean(stacked)
        flat = stacked.tolist()
        records, at = [], 0
        for pending in self._pending:
            values = dict(zip(pending.names, flat[at : at + len(pending.names)], strict=True))
            at += len(pending.names)
            records.append({"event": "train", "step": pending.step, **pending.host, **values})
        self._pending = []
        return records

    def divergence(self, records: list[dict[str, Any]]) -> str | None:
        """A message naming the first record with a non-finite value, or None."""
        for record in records:
            values = {k: v for k, v in record.items() if isinstance(v, float)}
            bad = [name for name, v in values.items() if not math.isfinite(v)]
            if bad:
                shown = ", ".join(f"{name}={v:.6g}" for name, v in values.items())
                return (
                    f"training diverged at step {record['step']} (objective "
                    f"'{self.objective_name}'): non-finite {', '.join(bad)} ({shown})"
                )
        return None


def stop_if_diverged(problem: str | None, ctx: Distributed, kept: Path | None) -> None:
    """Stop every rank when any rank's flushed records hold a non-finite value (``problem``:
    this rank's ``StepRecorder.divergence``), naming the last good checkpoint (``kept``)."""
    if dist_util.any_rank(problem is not None, ctx):
        where = f"the last good checkpoint is kept in {kept}" if kept else "no checkpoint yet"
        raise NonFiniteLossError(f"{problem or 'another rank diverged'}; {where}")


class LogTooShort(StageError):
    """The log holds fewer bytes than the checkpoint it is resumed from counted."""

    def __init__(self, path: Path, size: int, counted: int) -> None:
        super().__init__(f"{path}: {size} bytes, but its checkpoint counted {counted}")
        self.path, self.size, self.counted = path, size, counted


class JsonlLog:
    """The run's log.jsonl; on resume, cut back to what the checkpoint had seen."""

    def __init__(self, path: Path, truncate_at: int | None = None) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO = path.open("a", encoding="utf-8")
        if truncate_at is not None:
            size = path.stat().st_size
            if size < truncate_at:  # truncate would pad the log with NUL bytes
                self._file.close()
                raise LogTooShort(path, size, truncate_at)
            self._file.truncate(truncate_at)
            self._file.seek(truncate_at)

    @property
    def offset(self) -> int:
        return self._file.tell()

    def write(self, records: list[dict[str, Any]]) -> None:
        for record in records:
            self._file.write(json.dumps(record, allow_nan=True) + "\n")
        self._file.flush()

    def sync(self) -> None:
        """Put the log's bytes on the disk (before a checkpoint that counts them)."""
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()
