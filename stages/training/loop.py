"""The SimCSE-protocol training loop.

One step: the global batch's share of this rank, duplicated into two dropout views in one
forward pass (plus the dropout-off triplet forward for objectives that need it), pooled, the
objective in fp32 at the scheduled temperature, backward, optionally SAM's second pass, clip,
AdamW, learning-rate schedule. Every ``eval_steps`` and at the end the dev evaluator scores the
model and the best weights are kept; every ``checkpoint_steps`` a resumable checkpoint is
written. The inner loop never waits for the device except when it flushes the step records.

Run folder (``job.out_dir``): config.json, log.jsonl, checkpoint-<step>/ while running, then
best/ and final/ (Hugging Face and sentence-transformers model folders with tokenizer,
encoder.json, run.json and a model card README.md) and metrics.json.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm
from transformers import PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from stages.core.atomic import atomic_path, write_json
from stages.core.environment import software
from stages.core.errors import StageError
from stages.core.params import BackboneParams, TrainParams
from stages.core.run_store import CONFIG_FILE, LOG_FILE, METRICS_FILE
from stages.core.temperature_settings import TemperatureSchedule
from stages.modeling.backbone import load_backbone, load_tokenizer
from stages.modeling.checkpoint import EncoderInfo, write_encoder_info
from stages.modeling.model_card import render_model_card
from stages.modeling.st_format import write_sentence_transformers_files
from stages.modeling.unpadded import Packing
from stages.objectives.base import LossOutput, Objective
from stages.objectives.diagnostics import batch_diagnostics
from stages.objectives.temperature import tau_at
from stages.training import distributed as dist_util
from stages.training.data import (
    BatchPlan,
    TokenRows,
    TripletPool,
    load_tokenized_corpus,
    pad_rows,
    read_triplet_token_ids,
    special_token_frame,
)
from stages.training.dev import DevEncoder, DevEvaluator, max_model_length
from stages.training.distributed import Distributed
from stages.training.live import RunLog, open_run_log
from stages.training.model import (
    ContrastiveModel,
    enable_gradient_checkpointing,
    freeze_unused_head,
    reset_mlp_head,
)
from stages.training.optim import SharpnessAware, build_optimizer, build_scheduler, clip_gradients
from stages.training.records import NonFiniteLossError, StepRecorder
from stages.training.resume import (
    latest_checkpoint,
    load_checkpoint,
    remove_checkpoints,
    restore_rng_state,
    rng_state,
    save_checkpoint,
)
from stages.training.runtime import Runtime, device_name, resolve_runtime

RUN_CONFIG_IN_MODEL = "run.json"
MODEL_CARD = "README.md"
# InfoNCE's gradient norms in the batch diagnostics of objectives without a temperature use
# SimCSE's tau (paper 003's training-set curves, spec B.7: "tau = 0.05").
DIAGNOSTICS_TAU = 0.05
# Named phases of a step for torch.profiler (benchmarks/train_overhead.py); ~1 us each otherwise.
phase = torch.profiler.record_function


@dataclass(frozen=True)
class TrainJob:
    """Everything one training run needs; built from a planned Run by ``stages.train``."""

    run_id: str
    objective: Objective
    temperature: TemperatureSchedule
    train: TrainParams
    backbone: BackboneParams
    backbone_name: str
    seed: int
    corpus: Path
    out_dir: Path
    cache_dir: Path
    config: dict[str, Any] = field(default_factory=dict)
    max_sentences: int | None = None
    triplets: Path | None = None
    eval_batch_size: int = 128
    selection_metric: str = "spearman"
    live_dir: Path | None = None  # the live loggers' folder (train.loggers); None: no loggers


@dataclass
class Batch:
    ids: torch.Tensor
    mask: torch.Tensor
    triplet_ids: torch.Tensor | None = None
    triplet_mask: torch.Tensor | None = None
    packing: Packing | None = None  # where the real tokens are (host-built; unpadded forward)
    triplet_packing: Packing | None = None


def contrastive_loss(
    model: nn.Module,
    batch: Batch,
    objective: Objective,
    tau: float | None,
    runtime: Runtime,
    ctx: Distributed,
    gather_negatives: bool,
    diagnostics: bool = False,
) -> LossOutput:
    """Forward under the run's precision, then the objective over the (gathered) batch.

    Objectives turn autocast off and upcast their inputs themselves, so the loss is fp32.
    With ``diagnostics`` the stats also hold the batch's geometry (``batch_diagnostics``:
    alignment, uniformity, positive and negative angles, InfoNCE gradient norms) as ``batch_*``,
    detached and still on the device.
    """
    with phase("step.forward"), runtime.autocast():
        z, z_pos, triplets = model(
            batch.ids,
            batch.mask,
            batch.triplet_ids,
            batch.triplet_mask,
            packing=batch.packing,
            triplet_packing=batch.triplet_packing,
        )
    with phase("step.loss"):
        if gather_negatives and ctx.active:
            z, z_pos = dist_util.gather_with_grad(z, ctx), dist_util.gather_with_grad(z_pos, ctx)
            if triplets is not None:
                triplets = tuple(dist_util.gather_with_grad(h, ctx) for h in triplets)
        out = objective(z, z_pos, tau=tau, triplets=triplets)  # type: ignore[arg-type]
    if diagnostics:
        with phase("step.diagnostics"):
            geometry = batch_diagnostics(z, z_pos, DIAGNOSTICS_TAU if tau is None else tau)
            out.stats.update({f"batch_{name}": value for name, value in geometry.items()})
    return out


def make_batch(
    corpus: TokenRows,
    plan: BatchPlan,
    pool: TripletPool | None,
    step: int,
    rank: int,
    pad_id: int,
    runtime: Runtime,
    unpad: bool = False,
) -> Batch:
    """This rank's share of 0-based global ``step``, padded and on its way to the device; with
    ``unpad`` also where its real tokens are (computed here, on the host)."""
    ids, mask = pad_rows(corpus.rows(plan.shard(step, rank)), pad_id)
    batch = Batch(runtime.to_device(ids), runtime.to_device(mask))
    if unpad:
        batch.packing = Packing.from_mask(mask, runtime.to_device)
    if pool is not None:
        anchor, short, long = pool.shard(step, rank)
        t_ids, t_mask = pad_rows(anchor + short + long, pad_id)
        batch.triplet_ids, batch.triplet_mask = runtime.to_device(t_ids), runtime.to_device(t_mask)
        if unpad:
            batch.triplet_packing = Packing.from_mask(t_mask, runtime.to_device)
    return batch


def rank_seed(seed: int, rank: int) -> int:
    """Each rank's dropout stream (ranks must not share dropout masks)."""
    return int(np.random.SeedSequence([seed, rank]).generate_state(1)[0])


def train(
    job: TrainJob, evaluate_dev: DevEvaluator, ctx: Distributed | None = None
) -> dict[str, Any]:
    """Train (or resume) the run in ``job.out_dir``; return its metrics (also in metrics.json)."""
    ctx = ctx or Distributed()
    runtime = resolve_runtime(job.train.device, job.train.precision, ctx.local_rank)
    with dist_util.process_group(ctx, runtime.device):
        return _Training(job, evaluate_dev, ctx, runtime).run()


class _Training:
    def __init__(
        self, job: TrainJob, evaluate_dev: DevEvaluator, ctx: Distributed, runtime: Runtime
    ) -> None:
        self.job, self.ctx, self.runtime, self.evaluate_dev = job, ctx, runtime, evaluate_dev
        train = job.train
        if train.batch_size % ctx.world_size:
            raise StageError(
                f"train.batch_size ({train.batch_size}) must be a multiple of the number of "
                f"processes ({ctx.world_size}): it is the global batch, split evenly across ranks"
            )
        self.tokenizer = load_tokenizer(job.backbone)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.corpus = self._load_corpus()
        try:
            lengths = np.diff(self.corpus.offsets) if train.sampling == "by_length" else None
            self.plan = BatchPlan(
                len(self.corpus), train.batch_size, job.seed, ctx.world_size, lengths
            )
        except ValueError as err:
            raise StageError(f"{job.corpus}: {err}") from None
        self.accumulation = train.gradient_accumulation_steps
        self.updates_per_epoch = self.plan.steps_per_epoch // self.accumulation
        if self.updates_per_epoch == 0:
            raise StageError(
                f"{job.corpus}: {self.plan.steps_per_epoch} batch(es) per epoch cannot make one "
                f"update of train.gradient_accumulation_steps = {self.accumulation}"
            )
        self.total_steps = train.max_steps or train.epochs * self.updates_per_epoch
        self.encoder = self._load_encoder()
        self.pool = self._load_triplets() if job.objective.needs_triplets else None

        self.model = ContrastiveModel(
            self.encoder,
            train.pooler,
            train.view_dropout,
            train.triplet_dropout,
            unpad=train.unpad,
        )
        self.unpadded = self.model.unpadded
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = build_optimizer(self.model, train)
        self.scheduler = build_scheduler(self.optimizer, train, self.total_steps)
        self.sam = SharpnessAware(self.params, train.sam) if train.sam.enabled else None
        self.forward: nn.Module = self.model
        if ctx.active:
            device_ids = [runtime.device.index] if runtime.device.type == "cuda" else None
            self.forward = DistributedDataParallel(self.model, device_ids=device_ids)
        if train.compile:
            self.forward = torch.compile(self.forward, dynamic=True)  # type: ignore[assignment]

        self.dev_encoder = DevEncoder(
            self.encoder,
            self.tokenizer,
            train.eval_pooler,
            runtime,
            job.eval_batch_size,
            train.dev_precision,
        )
        self.dev_encoder.model.unpad = train.unpad  # the dev encoder's own ContrastiveModel
        self.recorder = StepRecorder(job.objective.name)
        self.step = 0
        self.evaluations: list[dict[str, Any]] = []
        self.best: dict[str, Any] | None = None
        self.best_weights: dict[str, torch.Tensor] | None = None
        self.best_unsaved = False
        self.elapsed_before = 0.0
        self.log: RunLog | None = None

    # --- setup ------------------------------------------------------------------------------

    def _load_corpus(self) -> TokenRows:
        job = self.job
        if not job.corpus.is_file():
            raise StageError(f"training corpus {job.corpus} not found (run the download stage)")

        def load() -> TokenRows:
            return load_tokenized_corpus(
                job.corpus,
                self.tokenizer,
                job.train.max_seq_length,
                job.cache_dir,
                job.max_sentences,
            )

        # Rank 0 tokenises and fills the cache; the others then read it.
        corpus = load() if self.ctx.is_main else None
        dist_util.barrier(self.ctx)
        if corpus is None:
            corpus = load()
        if len(corpus) == 0:
            raise StageError(f"training corpus {job.corpus} is empty")
        return corpus

    def _load_encoder(self) -> PreTrainedModel:
        job, train = self.job, self.job.train
        torch.manual_seed(job.seed)
        encoder = load_backbone(job.backbone, seed=job.seed, dropout=train.dropout)
        if train.pooler == "cls":
            reset_mlp_head(encoder, job.seed)
        else:
            freeze_unused_head(encoder)
        if train.gradient_checkpointing:
            enable_gradient_checkpointing(encoder)
        return encoder.to(self.runtime.device).train()

    def _load_triplets(self) -> TripletPool:
        path = self.job.triplets
        if path is None or not path.is_file():
            raise StageError(
                f"objective '{self.job.objective.name}' needs masked triplets, but the triplet "
                f"file {path} is missing (run the triplets stage)"
            )
        anchor, short, long = read_triplet_token_ids(path, self.job.max_sentences)
        if len(anchor) == 0:
            raise StageError(
                f"{path} holds no triplet for the corpus lines this run trains on "
                "(no line has triplets.min_words words?)"
            )
        prefix, suffix = special_token_frame(self.tokenizer)
        return TripletPool(
            anchor,
            short,
            long,
            prefix=tuple(prefix),
            suffix=tuple(suffix),
            batch_size=self.job.train.triplet_batch_size or self.job.train.batch_size,
            seed=self.job.seed,
            max_length=max_model_length(self.encoder, self.tokenizer),
            world_size=self.ctx.world_size,
        )

    # --- resume -----------------------------------------------------------------------------

    def _start(self) -> None:
        """Fresh start (config.json, seeded dropout) or resume from the latest checkpoint."""
        out = self.job.out_dir
        loaded = load_checkpoint(out)
        if loaded is None:
            torch.manual_seed(rank_seed(self.job.seed, self.ctx.rank))
            if self.ctx.is_main:
                write_json(out / CONFIG_FILE, {**self.job.config, "execution": self._execution()})
                self.log = self._open_log(truncate_at=0)
            return
        state, self.best_weights = loaded
        expected = (self.job.run_id, self.ctx.world_size, len(self.corpus))
        found = (state["run_id"], state["world_size"], state["n_rows"])
        if found != expected:
            raise StageError(
                f"{latest_checkpoint(out)}: checkpoint of (run, processes, corpus rows) {found} "
                f"cannot resume {expected}; delete {out} to start over"
            )
        self.encoder.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        restore_rng_state(state["rng"][self.ctx.rank], self.runtime.device)
        self.step = state["step"]
        self.evaluations = state["evaluations"]
        self.best = state["best"]
        self.elapsed_before = state["elapsed_s"]
        if self.ctx.is_main:
            self.log = self._open_log(truncate_at=state["log_offset"])
            self.log.write([{"event": "resume", "step": self.step}])

    def _open_log(self, truncate_at: int) -> RunLog:
        job = self.job
        return open_run_log(
            job.out_dir / LOG_FILE,
            truncate_at,
            job.train.loggers if job.live_dir is not None else (),
            job.live_dir,
            str(job.config.get("experiment", job.run_id)),
            job.config,
        )

    def _execution(self) -> dict[str, Any]:
        return {
            "device": str(self.runtime.device),
            "precision": self.runtime.precision,
            "eval_precision": self.dev_encoder.precision,
            "world_size": self.ctx.world_size,
            "compile": self.job.train.compile,
            **software(),
            "unpadded": self.model.unpadded,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "cuda": torch.version.cuda,
            "device_name": device_name(self.runtime.device),
            "total_steps": self.total_steps,
            "steps_per_epoch": self.updates_per_epoch,
            "batches_per_update": self.accumulation,
            "corpus_rows": len(self.corpus),
        }

    # --- the loop ---------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        self._start()
        train = self.job.train
        started = time.perf_counter()
        first_step = self.step
        bar = tqdm(
            total=self.total_steps,
            initial=self.step,
            desc=f"train {self.job.run_id[:8]}",
            unit="step",
            disable=not self.ctx.is_main,
            dynamic_ncols=True,
        )
        try:
            while self.step < self.total_steps:
                self._train_step()
                self.step += 1
                bar.update(1)
                t = self.step
                last = t == self.total_steps
                evaluate = t % train.eval_steps == 0 or last
                checkpoint = t % train.checkpoint_steps == 0 and not last
                if t % train.log_steps == 0 or evaluate or checkpoint or last:
                    self._flush(bar)
                if evaluate:
                    self._evaluate(t, bar)
                if checkpoint:
                    elapsed = self.elapsed_before + time.perf_counter() - started
                    self._checkpoint(elapsed)
            wall = time.perf_counter() - started
            return self._finish(self.elapsed_before + wall, wall, self.step - first_step)
        finally:
            bar.close()
            if self.log is not None:
                self.log.close()

    def _train_step(self) -> None:
        """One update: ``gradient_accumulation_steps`` micro-batches (each its own contrastive
        batch, micro-batch index = update * accumulation + k, so a resumed run finds its data by
        the update count), the gradient of their mean loss, SAM's second pass over the same
        micro-batches, clip, step."""
        job, train = self.job, self.job.train
        t = self.step + 1  # 1-based, as the temperature schedules count
        with phase("step.data"):
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
                )
                for m in range(self.step * self.accumulation, t * self.accumulation)
            ]
        objective = job.objective
        tau = (
            tau_at(job.temperature, t, self.total_steps, objective.initial_tau)
            if objective.uses_temperature and objective.initial_tau is not None
            else None
        )
        lr = self.scheduler.get_last_lr()[0]

        def backward(diagnostics: bool = False) -> LossOutput:
            """Backpropagate the mean loss over the micro-batches; their mean loss and stats."""
            outs = []
            for batch in batches:
                out = contrastive_loss(
                    self.forward,
                    batch,
                    objective,
                    tau,
                    self.runtime,
                    self.ctx,
                    train.gather_negatives,
                    diagnostics,
                )
                with phase("step.backward"):
                    (out.loss / len(batches)).backward()
                outs.append(out)
            if len(outs) == 1:
                return outs[0]
            mean = {k: sum(o.stats[k] for o in outs) / len(outs) for k in outs[0].stats}
            return LossOutput(sum(o.loss.detach() for o in outs) / len(outs), mean)

        out = backward(diagnostics=True)
        if self.sam is not None:
            with phase("step.sam"):
                self.sam.ascend()
                backward()
                self.sam.restore()
        with phase("step.clip"):
            grad_norm = clip_gradients(self.params, train.max_grad_norm)
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

    def _flush(self, bar: tqdm) -> None:
        with phase("step.logging"):
            self._flush_records(bar)

    def _flush_records(self, bar: tqdm) -> None:
        average = None
        if self.ctx.active and not self.job.train.gather_negatives:
            # Without gathering each rank's loss covers only its own share of the batch.
            def average(values: torch.Tensor) -> None:
                torch.distributed.all_reduce(values)
                values.div_(self.ctx.world_size)

        records = self.recorder.flush(average)
        if self.log is not None:
            self.log.write(records)
        problem = self.recorder.divergence(records)
        if dist_util.any_rank(problem is not None, self.ctx):
            kept = latest_checkpoint(self.job.out_dir)
            where = f"the last good checkpoint is kept in {kept}" if kept else "no checkpoint yet"
            raise NonFiniteLossError(f"{problem or 'another rank diverged'}; {where}")
        if records:
            bar.set_postfix(loss=f"{records[-1]['loss']:.4f}", refresh=False)

    def _evaluate(self, step: int, bar: tqdm) -> None:
        if self.ctx.is_main:
            began = time.perf_counter()
            scores = {k: float(v) for k, v in self.evaluate_dev(self.dev_encoder).items()}
            key = self.job.selection_metric
            if key not in scores:
                raise StageError(f"the dev evaluator returned {sorted(scores)}, not '{key}'")
            improved = math.isfinite(scores[key]) and (
                self.best is None or scores[key] > self.best[key]
            )
            if improved:
                self.best = {"step": step, **scores}
                self.best_weights = {
                    k: v.detach().to("cpu", copy=True) for k, v in self.encoder.state_dict().items()
                }
                self.best_unsaved = True
            self.evaluations.append({"step": step, **scores})
            assert self.log is not None
            self.log.write(
                [
                    {
                        "event": "eval",
                        "step": step,
                        **scores,
                        "best": improved,
                        "eval_precision": self.dev_encoder.precision,
                        "eval_s": time.perf_counter() - began,
                    }
                ]
            )
            if self.best is not None:
                bar.set_postfix(dev=f"{scores[key]:.2f}", best=f"{self.best[key]:.2f}")
        # Every rank keeps the evaluation history, so any rank's view of the run agrees.
        self.best, self.evaluations = dist_util.broadcast_object(
            (self.best, self.evaluations), self.ctx
        )

    def _checkpoint(self, elapsed: float) -> None:
        rngs = dist_util.gather_objects(rng_state(self.runtime.device), self.ctx)
        if self.ctx.is_main:
            assert self.log is not None
            state = {
                "run_id": self.job.run_id,
                "world_size": self.ctx.world_size,
                "n_rows": len(self.corpus),
                "step": self.step,
                "model": self.encoder.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "rng": rngs,
                "evaluations": self.evaluations,
                "best": self.best,
                "log_offset": self.log.offset,
                "elapsed_s": elapsed,
            }
            best = self.best_weights if self.best_unsaved else None
            try:
                save_checkpoint(self.job.out_dir, self.step, state, best)
            except OSError as err:  # a full disk, a quota: the half-written one is removed
                kept = latest_checkpoint(self.job.out_dir)
                where = f"the previous checkpoint {kept} is intact" if kept else "no checkpoint yet"
                raise StageError(
                    f"could not write the checkpoint of step {self.step} ({err}); {where}"
                ) from err
            self.best_unsaved = False
        dist_util.barrier(self.ctx)

    # --- outputs ----------------------------------------------------------------------------

    def _finish(self, elapsed: float, wall: float, steps_now: int) -> dict[str, Any]:
        job = self.job
        if self.best is None:
            raise StageError(
                f"run {job.run_id}: no evaluation gave a finite dev '{job.selection_metric}'"
            )
        metrics = {
            "run_id": job.run_id,
            "steps": self.step,
            "epochs": self.step / self.updates_per_epoch,
            "batch_size": job.train.batch_size,
            "best": self.best,
            "final": self.evaluations[-1],
            "evaluations": self.evaluations,
            "timing": {
                "wall_s": elapsed,
                "steps_this_session": steps_now,
                "steps_per_s_this_session": steps_now / wall if wall > 0 else None,
                "device": str(self.runtime.device),
                "precision": self.runtime.precision,
                "eval_precision": self.dev_encoder.precision,
                "world_size": self.ctx.world_size,
            },
        }
        if self.ctx.is_main:
            info = EncoderInfo(
                eval_pooler=job.train.eval_pooler,
                train_pooler=job.train.pooler,
                max_seq_length=job.train.max_seq_length,
                run_id=job.run_id,
                backbone=job.backbone_name,
            )
            config = {**job.config, "execution": self._execution()}
            card = render_model_card(config, metrics)
            save_encoder(job.out_dir / "final", self.encoder, self.tokenizer, info, config, card)
            assert self.best_weights is not None
            self.encoder.load_state_dict(self.best_weights)
            save_encoder(job.out_dir / "best", self.encoder, self.tokenizer, info, config, card)
            write_json(job.out_dir / METRICS_FILE, metrics)
            remove_checkpoints(job.out_dir)
        dist_util.barrier(self.ctx)
        return metrics


def save_encoder(
    dest: Path,
    encoder: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    info: EncoderInfo,
    run_config: dict[str, Any],
    model_card: str | None = None,
) -> None:
    """A trained encoder folder: safetensors weights, tokenizer, encoder.json, run.json, also a
    sentence-transformers model folder for the evaluation pooler, with a model card README.md."""
    with atomic_path(dest) as tmp:
        encoder.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        write_encoder_info(tmp, info)
        write_json(tmp / RUN_CONFIG_IN_MODEL, run_config)
        write_sentence_transformers_files(tmp, info.eval_pooler)
        if model_card is not None:
            (tmp / MODEL_CARD).write_text(model_card, encoding="utf-8")
