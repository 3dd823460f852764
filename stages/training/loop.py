"""The SimCSE-protocol training loop, on one page: ``train`` reads top to bottom (set up, start
or resume, the step loop with its logging, dev evaluation and checkpoints, the finished run's
outputs); ``Training.train_step`` below it is one optimizer update (the views, the forward,
the loss, backward, clipping, AdamW, the schedules).

The step never waits for the device: its values stay there until the records are flushed, every
``log_steps`` and before every evaluation and checkpoint.

Run folder (``job.out_dir``): config.json, log.jsonl, checkpoint-<step>/ while running, then
best/ and final/ (Hugging Face and sentence-transformers model folders with tokenizer,
encoder.json, run.json and a model card README.md) and metrics.json.

Where the rest is: ``parts`` (corpus, batch plan, encoder, optimizer, schedule, dev encoder),
``batch`` (a step's rows on the device), ``loss`` (forward and objective), ``checkpoints`` (fresh
start or resume, checkpoint folders and their content), ``progress`` (evaluations, the best
weights), ``records`` and ``live`` (the log), ``outputs`` (model folders, metrics).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from tqdm.auto import tqdm

from stages.core.errors import StageError
from stages.core.storage.atomic import write_json
from stages.core.storage.run_folders import CONFIG_FILE, METRICS_FILE
from stages.objectives.base import LossOutput
from stages.objectives.temperature import tau_at
from stages.training import distributed as dist_util
from stages.training.batch import Batch, make_batch
from stages.training.cached_step import average_gradients, cached_contrastive_step
from stages.training.checkpoints import (
    checkpoint_state,
    latest_checkpoint,
    remove_checkpoints,
    rng_state,
    save_checkpoint,
    start_or_resume,
    unwritten_checkpoint_error,
)
from stages.training.compile_watch import DynamoCounts, first_compiled_step, record_dynamo_counts
from stages.training.dev_encoder import DevEvaluator
from stages.training.distributed import Distributed, mean_across_ranks
from stages.training.job import TrainJob
from stages.training.loss import contrastive_loss, mean_over_micro_batches
from stages.training.optim import clip_gradients
from stages.training.outputs import run_metrics, save_encoder, save_final_and_best
from stages.training.parts import TrainingParts
from stages.training.records import stop_if_diverged
from stages.training.runtime import compile_inputs, phase, resolve_runtime

# What other code imports from here: the runner, the benchmarks, the tests.
__all__ = ["Batch", "StepHook", "TrainJob", "Training", "contrastive_loss", "save_encoder", "train"]


# Runs one optimizer step: ``step_hook(step)`` must call ``step()`` once (it may time it, watch
# it or wrap it in a context); the benchmarks and tests use it instead of patching the loop.
StepHook = Callable[[Callable[[], None]], None]


def train(
    job: TrainJob,
    evaluate_dev: DevEvaluator,
    ctx: Distributed | None = None,
    *,
    step_hook: StepHook | None = None,
    until_step: int | None = None,
) -> dict[str, Any] | None:
    """Train (or resume) the run in ``job.out_dir``; return its metrics (also in metrics.json).
    ``step_hook`` (optional) runs each optimizer step. ``until_step``: stop after that update
    with the log flushed and no model written, returning None (a replay of a run's first steps,
    ``stages.training.replay``)."""
    ctx = ctx or Distributed()
    settings = job.train
    runtime = resolve_runtime(
        settings.device,
        settings.precision,
        ctx.local_rank,
        settings.compile,
        processes=ctx.world_size,
        **compile_inputs(settings, needs_triplets=job.objective.needs_triplets),
    )
    with dist_util.process_group(ctx, runtime.device), ExitStack() as contexts:
        contexts.enter_context(runtime.fp32_matmuls())
        # Set up: corpus, batch plan, encoder, AdamW, schedule, dev encoder (parts.py).
        run = Training(job, evaluate_dev, ctx, runtime)
        # Fresh (config.json, seeded dropout) or from the latest checkpoint (checkpoints.py).
        progress, log = start_or_resume(run)
        dynamo_before = DynamoCounts.now()
        # Without gathered negatives each rank's loss covers only its share of the batch.
        average = mean_across_ranks(ctx) if ctx.active and not settings.gather_negatives else None
        started, first_step = time.perf_counter(), run.step
        bar = tqdm(
            total=run.total_steps,
            initial=run.step,
            desc=f"train {job.run_id[:8]}",
            unit="step",
            disable=not ctx.is_main,
            dynamic_ncols=True,
        )
        stop_at = run.total_steps if until_step is None else min(until_step, run.total_steps)

        def take_step() -> None:
            # views, forward, loss, backward, clip, AdamW, schedules: Training.train_step
            if step_hook is None:
                run.train_step()
            else:
                step_hook(run.train_step)

        try:
            while run.step < stop_at:
                if run.runtime.compile and run.step == first_step:
                    # compiles; under compile auto a failure reruns the step eagerly
                    if first_compiled_step(run, take_step):
                        contexts.enter_context(run.runtime.fp32_matmuls())
                        record_execution(run)
                else:
                    take_step()
                run.step += 1
                bar.update(1)
                step = run.step
                last = step == run.total_steps
                evaluate = step % settings.eval_steps == 0 or last
                checkpoint = step % settings.checkpoint_steps == 0 and not last

                # Logging: the one host read of the steps' values since the last flush.
                if step % settings.log_steps == 0 or evaluate or checkpoint or step == stop_at:
                    with phase("step.logging"):
                        records = run.recorder.flush(average)
                        if log is not None:
                            log.write(records)
                        problem = run.recorder.divergence(records)
                        stop_if_diverged(problem, ctx, latest_checkpoint(job.out_dir))
                        if records:
                            bar.set_postfix(loss=f"{records[-1]['loss']:.4f}", refresh=False)

                # Dev evaluation (rank 0); the best weights so far are kept.
                if evaluate and ctx.is_main:
                    assert log is not None
                    began = time.perf_counter()
                    scores = run.evaluate()
                    key = job.selection_metric
                    improved = progress.add_evaluation(step, scores, key, run.encoder)
                    log.write(
                        [
                            {
                                "event": "eval",
                                "step": step,
                                **scores,
                                "best": improved,
                                "eval_precision": run.dev_encoder.precision,
                                "eval_s": time.perf_counter() - began,
                            }
                        ]
                    )
                    if progress.best is not None:
                        bar.set_postfix(dev=f"{scores[key]:.2f}", best=f"{progress.best[key]:.2f}")
                if evaluate:  # every rank keeps the evaluation history, so their views agree
                    progress.best, progress.evaluations = dist_util.broadcast_object(
                        (progress.best, progress.evaluations), ctx
                    )

                # A resumable checkpoint (rank 0 writes it; every rank's RNG state is in it).
                if checkpoint:
                    elapsed = progress.elapsed_before + time.perf_counter() - started
                    rngs = dist_util.gather_objects(rng_state(runtime.device), ctx)
                    if ctx.is_main:
                        assert log is not None
                        log.sync()  # a crash must not leave the log shorter than state.pt says
                        state = checkpoint_state(run, progress, rngs, log.offset, elapsed)
                        best = progress.best_weights if progress.best_unsaved else None
                        try:
                            save_checkpoint(job.out_dir, step, state, best)
                        except OSError as err:  # a full disk, a quota
                            raise unwritten_checkpoint_error(job.out_dir, step, err) from err
                        progress.best_unsaved = False
                    dist_util.barrier(ctx)

            if run.step < run.total_steps:  # stopped at until_step
                return None
            # Finish: final/ and best/ model folders, metrics.json; the checkpoints go.
            wall = time.perf_counter() - started
            if progress.best is None:
                raise StageError(
                    f"run {job.run_id}: no evaluation gave a finite dev '{job.selection_metric}'"
                )
            elapsed = progress.elapsed_before + wall
            metrics = run_metrics(run, progress, elapsed, wall, run.step - first_step)
            if runtime.compile:  # compiled at the start (fallen back or not)
                record_dynamo_counts(run, dynamo_before)
            if ctx.is_main:
                assert progress.best_weights is not None
                record_execution(run)
                save_final_and_best(run, progress.best_weights, metrics)
                write_json(job.out_dir / METRICS_FILE, metrics)
                remove_checkpoints(job.out_dir)
            dist_util.barrier(ctx)
            return metrics
        finally:
            bar.close()
            if log is not None:
                log.close()


def record_execution(run: TrainingParts) -> None:
    """config.json again (rank 0), once how the run executes changed (a fallback to eager) or
    is complete (dynamo's counts)."""
    if run.ctx.is_main:
        write_json(run.job.out_dir / CONFIG_FILE, {**run.job.config, "execution": run.execution()})


class Training(TrainingParts):
    """A run's parts (parts.py); ``train_step`` is one optimizer update."""

    def train_step(self) -> None:
        """One update: ``gradient_accumulation_steps`` micro-batches (each its own contrastive
        batch, micro-batch index = update * accumulation + k, so a resumed run finds its data by
        the update count), the gradient of their mean loss (with ``embedding_chunk_size``, each
        micro-batch encoded a chunk at a time: cached_step.py), SAM's second pass over the same
        micro-batches, clip, step."""
        job, settings = self.job, self.job.train
        t = self.step + 1  # 1-based, as the temperature schedules count
        with phase("step.data"):  # each micro-batch's rows; the model duplicates them into views
            batches = [
                make_batch(
                    self.corpus,
                    self.plan,
                    self.pool,
                    m,
                    self.ctx.rank,
                    self.pad_id,
                    self.runtime,
                    unpad=self.unpadded,
                    max_length=settings.max_seq_length,
                )
                for m in range(self.step * self.accumulation, t * self.accumulation)
            ]
        objective = job.objective
        tau = (  # the temperature schedule
            tau_at(job.temperature, t, self.total_steps, objective.initial_tau)
            if objective.uses_temperature and objective.initial_tau is not None
            else None
        )
        lr = self.scheduler.get_last_lr()[0]

        chunk_rows = settings.embedding_chunk_size

        def backward(diagnostics: bool = False) -> LossOutput:
            """Backpropagate the mean loss over the micro-batches; their mean loss and stats."""
            outs = []
            for batch in batches:
                if chunk_rows is None:
                    out = contrastive_loss(  # the loss: forward, then the objective (loss.py)
                        self.forward,
                        batch,
                        objective,
                        tau,
                        self.runtime,
                        self.ctx,
                        settings.gather_negatives,
                        diagnostics,
                    )
                    with phase("step.backward"):
                        (out.loss / len(batches)).backward()
                else:  # the same, a chunk of rows at a time (cached_step.py)
                    out = cached_contrastive_step(
                        self.model,
                        batch,
                        objective,
                        tau,
                        self.runtime,
                        self.ctx,
                        settings.gather_negatives,
                        chunk_rows,
                        len(batches),
                        diagnostics,
                    )
                outs.append(out)
            if chunk_rows is not None:
                average_gradients(self.params, self.ctx)
            return mean_over_micro_batches(outs)

        out = backward(diagnostics=True)
        if self.sam is not None:
            with phase("step.sam"):
                self.sam.ascend()
                backward()
                self.sam.restore()
        with phase("step.clip"):
            grad_norm = clip_gradients(self.params, settings.max_grad_norm)
        with phase("step.optimizer"):
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        with phase("step.scheduler"):
            self.scheduler.step()
        with phase("step.record"):
            self.recorder.record(
                t,
                {"loss": out.loss, "grad_norm": grad_norm, **out.stats},
                epoch=t / self.updates_per_epoch,
                lr=lr,
                tau=tau,
            )
