"""From a planned ``Run`` to its finished folder in the runs store: train (or resume) it in
``<run_id>.partial/`` and make it visible as ``<run_id>/`` by one rename once complete."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

from stages.core.errors import StageError
from stages.core.identity.experiments import Run
from stages.core.schema.params import Params
from stages.core.storage import layout
from stages.core.storage.atomic import rename_durably
from stages.core.storage.run_folders import METRICS_FILE, is_complete
from stages.core.storage.shared_store import write_origin
from stages.objectives.registry import build_objective
from stages.senteval_protocol.loaders import DataFormatError
from stages.senteval_protocol.stsb_dev import StsbDevEvaluation
from stages.training.checkpoints import remove_checkpoints
from stages.training.dev_encoder import DevEvaluator, Encode
from stages.training.distributed import Distributed, from_environment
from stages.training.loop import TrainJob, train


def stsb_dev_evaluator(data_dir: Path) -> DevEvaluator:
    """STS-B dev exactly as the SentEval stage scores it (``StsbDevEvaluation``): Spearman x100
    of cosine vs gold, plus alignment and uniformity of the same embeddings. The trainer's
    encoder batches by token length itself, so it gets all distinct sentences in one call."""
    try:
        evaluation = StsbDevEvaluation(data_dir, batch_size=None)
    except (DataFormatError, OSError) as error:
        raise StageError(f"STS-B dev set (checkpoint selection): {error}") from error

    def evaluate(encode: Encode) -> dict[str, float]:
        scores = evaluation(encode)
        return {
            "spearman": scores.spearman,
            "alignment": scores.alignment,
            "uniformity": scores.uniformity,
        }

    return evaluate


def make_job(run: Run, params: Params, out_dir: Path) -> TrainJob:
    """The train job of planned ``run``, trained in ``out_dir``."""
    return TrainJob(
        run,
        build_objective(run.settings.objective),
        out_dir,
        layout.CACHE / "tokenized",
        eval_batch_size=params.evaluations.senteval.batch_size,
        live_dir=layout.live_dir(run.name),
    )


def train_run(run: Run, params: Params, ctx: Distributed | None = None) -> Path:
    """The finished run folder of ``run``, training (or resuming) it unless it is stored."""
    ctx = ctx or from_environment()
    final = run.run_dir
    if is_complete(final):
        return final
    partial = run.partial_dir
    if not (partial / METRICS_FILE).is_file():
        evaluate = stsb_dev_evaluator(layout.senteval_dir())
        try:
            train(make_job(run, params, partial), evaluate, ctx)
        except StageError as err:
            raise StageError(f"{err}{unfinished_run_note(partial)}") from err
    if ctx.is_main:
        remove_checkpoints(partial)
        write_origin(partial, {"origin": "trained", "host": socket.gethostname()})
        if final.exists():  # an unfinished leftover
            shutil.rmtree(final)
        rename_durably(partial, final)
    return final


def unfinished_run_note(partial: Path) -> str:
    """Where a stopped run's outputs are, if it left any (a run refused before its first
    output, e.g. for a backbone that cannot be loaded, leaves none)."""
    if not partial.is_dir():
        return ""
    return (
        f"\nThe unfinished run is in {partial}: a rerun resumes it from its last checkpoint; "
        f"to start over instead, delete {partial}"
    )
