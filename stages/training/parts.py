"""What a run is built from before its first step: the tokenised corpus and its batch plan, the
triplet pool (objectives that need one), the encoder in its training wrapper, AdamW, the
learning-rate schedule, SAM, the dev encoder and the step recorder.

Building them consumes the global RNG in a fixed order (the encoder's initialisation is seeded
with the run's seed), so a run and its resumption build the same parts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import torch
import transformers
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from transformers import PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from stages.core.errors import StageError
from stages.core.identity.environment import software
from stages.modeling.backbone import ModelLoadError, load_backbone, load_tokenizer
from stages.modeling.cpu_linear import use_onednn_linear
from stages.modeling.dropout import use_fast_dropout
from stages.modeling.input_length import LIMIT_PARTS, max_model_length
from stages.training import distributed as dist_util
from stages.training.contrastive_model import (
    ContrastiveModel,
    enable_gradient_checkpointing,
    freeze_embeddings,
    freeze_unused_head,
    reset_mlp_head,
)
from stages.training.data import (
    BatchPlan,
    TokenRows,
    TripletPool,
    load_tokenized_corpus,
    read_triplet_token_ids,
    special_token_frame,
)
from stages.training.dev_encoder import DevEncoder, DevEvaluator
from stages.training.distributed import Distributed
from stages.training.job import TrainJob
from stages.training.optim import SharpnessAware, build_optimizer, build_scheduler
from stages.training.records import StepRecorder
from stages.training.runtime import Runtime, device_name

T = TypeVar("T")


class TrainingParts:
    """A run's parts, built from its job (``forward`` is the model as the step calls it: wrapped
    in DDP with several processes, compiled with ``train.compile``), and its ``step``: the
    optimizer updates done (a resumed run's are its checkpoint's)."""

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
        self.tokenizer = backbone_part(
            lambda: load_tokenizer(job.backbone, job.backbone_name), job.backbone_name
        )
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.encoder = load_encoder(job, runtime)
        longest = max_model_length(self.encoder.config, self.tokenizer)
        if train.max_seq_length > longest:
            # longer rows would index past the position embeddings, deep in the forward; checked
            # before the corpus is tokenised (a minute for wiki1m)
            raise StageError(
                f"train.max_seq_length ({train.max_seq_length}) exceeds the {longest} tokens "
                f"backbone {job.backbone_name} takes ({LIMIT_PARTS}, where every evaluation "
                f"truncates): set it to {longest} or less"
            )
        self.corpus = load_corpus(job, self.tokenizer, ctx)
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
        self.pool = (
            load_triplets(job, self.tokenizer, self.encoder, ctx)
            if job.objective.needs_triplets
            else None
        )

        self.model = ContrastiveModel(
            self.encoder,
            train.pooler,
            train.view_dropout,
            train.triplet_dropout,
            unpad=runtime.unpad,  # train.unpad as the compile setting resolved it
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
        self.eager_forward = self.forward
        if runtime.compile:
            mode = "reduce-overhead" if runtime.compile == "reduce-overhead" else None
            self.forward = torch.compile(  # type: ignore[assignment]
                self.forward, dynamic=True, mode=mode
            )

        self.dev_encoder = DevEncoder(
            self.encoder,
            self.tokenizer,
            train.dev_pooler or train.eval_pooler,
            runtime,
            job.eval_batch_size,
            train.dev_precision,
        )
        self.dev_encoder.model.unpad = runtime.unpad  # its own ContrastiveModel, as training
        self.recorder = StepRecorder(job.objective.name)
        self.step = 0
        # dynamo's counts over this process's steps (compile_watch.DynamoCounts); None: eager
        self.dynamo: dict[str, int] | None = None

    def fall_back_to_eager(self, reason: str) -> None:
        """Run on as ``compile: false`` runs (its dropout modules and Linear layers, the
        uncompiled forward), with ``reason`` recorded; the forward keeps its padding."""
        self.runtime = self.runtime.eager(reason)
        use_fast_dropout(self.encoder)
        if self.runtime.onednn_linear:
            use_onednn_linear(self.encoder)
        self.forward = self.eager_forward

    def evaluate(self) -> dict[str, float]:
        """The dev evaluator's scores of the model as it is now (they must hold the metric that
        selects the best checkpoint)."""
        scores = {k: float(v) for k, v in self.evaluate_dev(self.dev_encoder).items()}
        key = self.job.selection_metric
        if key not in scores:
            raise StageError(f"the dev evaluator returned {sorted(scores)}, not '{key}'")
        return scores

    def execution(self) -> dict[str, Any]:
        """How the run executes (config.json's and the model card's ``execution``)."""
        return {
            "device": str(self.runtime.device),
            "precision": self.runtime.precision,
            "eval_precision": self.dev_encoder.precision,
            "world_size": self.ctx.world_size,
            "compile": self.runtime.compile,  # train.compile resolved on this device
            "compile_reason": self.runtime.compile_reason,
            "dynamo": self.dynamo,
            "packed_rows_multiple": self.runtime.packed_rows_multiple if self.unpadded else None,
            "embedding_chunk_size": self.job.train.embedding_chunk_size,
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
            # a CPU's sums depend on how many threads split them: a replay uses as many
            "threads": torch.get_num_threads(),
        }


def load_corpus(job: TrainJob, tokenizer: PreTrainedTokenizerBase, ctx: Distributed) -> TokenRows:
    if not job.corpus.is_file():
        raise StageError(f"training corpus {job.corpus} not found (run the download stage)")

    def load() -> TokenRows:
        return load_tokenized_corpus(
            job.corpus, tokenizer, job.train.max_seq_length, job.cache_dir, job.max_sentences
        )

    # Rank 0 tokenises and fills the cache; the others then read it.
    corpus = load() if ctx.is_main else None
    dist_util.barrier(ctx)
    if corpus is None:
        corpus = load()
    if len(corpus) == 0:
        raise StageError(f"training corpus {job.corpus} is empty")
    return corpus


def backbone_part(load: Callable[[], T], key: str) -> T:
    """``load()``; backbone ``key``'s errors (a model that cannot be loaded, a family or a
    dropout the pipeline does not support) as a StageError naming it."""
    try:
        return load()
    except ModelLoadError as err:  # its message names the key already
        raise StageError(str(err)) from None
    except ValueError as err:
        raise StageError(f"backbones.{key}: {err}") from None


def load_encoder(job: TrainJob, runtime: Runtime) -> PreTrainedModel:
    """The backbone, seeded, with a fresh MLP head (``cls``: SimCSE's, or ``train.head``) or
    its head frozen; its embedding layer frozen with ``train.freeze_embeddings``."""
    train = job.train
    torch.manual_seed(job.seed)
    encoder = backbone_part(
        lambda: load_backbone(
            job.backbone, seed=job.seed, dropout=train.dropout, key=job.backbone_name
        ),
        job.backbone_name,
    )
    if not runtime.compile:
        # FastDropout draws its CPU masks with an in-place random_, where torch.compile breaks
        # the graph at every dropout; compiled, the backbone's own dropout is traced instead
        use_fast_dropout(encoder)
    if train.pooler == "cls":
        reset_mlp_head(encoder, job.seed, train.head, train.head_init_std)
    else:
        freeze_unused_head(encoder)
    if train.freeze_embeddings:
        backbone_part(lambda: freeze_embeddings(encoder), job.backbone_name)
    if runtime.onednn_linear:  # fp32 products on oneDNN (cpu_linear.py), the head's included
        use_onednn_linear(encoder)
    if train.gradient_checkpointing:
        enable_gradient_checkpointing(encoder)
    return encoder.to(runtime.device).train()


def load_triplets(
    job: TrainJob, tokenizer: PreTrainedTokenizerBase, encoder: PreTrainedModel, ctx: Distributed
) -> TripletPool:
    path = job.triplets
    if path is None or not path.is_file():
        raise StageError(
            f"objective '{job.objective.name}' needs masked triplets, but the triplet "
            f"file {path} is missing (run the triplets stage)"
        )
    if job.train.triplet_batching == "batch" and ctx.world_size > 1:
        raise StageError(
            "train.triplet_batching: batch runs on one process (the ranks' shares would hold "
            "different numbers of triplets, which the gathered triplet loss cannot weigh); "
            "use pool on several GPUs"
        )
    lines, anchor, short, long = read_triplet_token_ids(path, job.max_sentences)
    if len(anchor) == 0:
        raise StageError(
            f"{path} holds no triplet for the corpus lines this run trains on "
            "(no line has triplets.min_words words?)"
        )
    prefix, suffix = special_token_frame(tokenizer)
    return TripletPool(
        anchor,
        short,
        long,
        prefix=tuple(prefix),
        suffix=tuple(suffix),
        batch_size=job.train.triplet_batch_size or job.train.batch_size,
        seed=job.seed,
        max_length=max_model_length(encoder.config, tokenizer),
        world_size=ctx.world_size,
        lines=lines,
        batching=job.train.triplet_batching,
    )
