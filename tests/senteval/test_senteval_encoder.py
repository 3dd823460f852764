"""SentenceEncoder on tiny random BERTs with the real MiniLM tokenizer: input order, duplicates,
poolers from encoder.json, fingerprints, and loud failures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from senteval_testing import save_tiny_bert
from transformers import AutoModel, AutoTokenizer

from stages.core.storage import layout
from stages.modeling.checkpoint import EncoderInfo, write_encoder_info
from stages.modeling.encoder import EncoderError, SentenceEncoder, length_batches
from stages.modeling.pooling import pool

SENTENCES = ["a man plays a guitar .", "two dogs run", "a man plays a guitar .", "", "hi"]


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory, minilm_path: str) -> Path:
    return save_tiny_bert(tmp_path_factory.mktemp("tiny") / "model", minilm_path)


def test_rows_follow_the_input_and_match_one_sentence_at_a_time(tiny_bert: Path) -> None:
    encoder = SentenceEncoder(str(tiny_bert), "mean", batch_size=2, device="cpu")
    rows = encoder(SENTENCES)
    assert rows.shape == (5, 32) and rows.dtype == np.float32
    np.testing.assert_array_equal(rows[0], rows[2])
    model = AutoModel.from_pretrained(tiny_bert).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    for sentence, row in zip(SENTENCES, rows, strict=True):
        batch = tokenizer([sentence], return_tensors="pt")
        with torch.no_grad():
            expected = pool(model(**batch), batch["attention_mask"], "mean")[0]
        np.testing.assert_allclose(row, expected.numpy(), rtol=1e-5, atol=1e-5)


def test_sentences_are_cut_to_the_longest_input_the_model_takes(
    tiny_bert: Path, tmp_path: Path, minilm_path: str
) -> None:
    assert SentenceEncoder(str(tiny_bert), "mean", device="cpu").max_length == 512
    short = save_tiny_bert(tmp_path / "short", minilm_path, positions=16)
    encoder = SentenceEncoder(str(short), "mean", device="cpu")
    assert encoder.max_length == 16 and encoder.describe()["max_length"] == 16
    long = "a man plays a guitar " * 8  # 42 tokens: past the 16 positions untruncated
    model = AutoModel.from_pretrained(short).eval()
    batch = AutoTokenizer.from_pretrained(short)([long], truncation=True, max_length=16,
                                                return_tensors="pt")  # fmt: skip
    with torch.no_grad():
        expected = pool(model(**batch), batch["attention_mask"], "mean")[0]
    np.testing.assert_allclose(encoder([long])[0], expected.numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(EncoderError, match=r"max_length 17 exceeds the 16 tokens it takes"):
        SentenceEncoder(str(short), "mean", device="cpu", max_length=17)


def test_checkpoint_pooler_comes_from_encoder_json_and_overrides_are_recorded(
    tiny_bert: Path, tmp_path: Path
) -> None:
    checkpoint = save_tiny_bert(tmp_path / "ckpt", str(tiny_bert))
    write_encoder_info(
        checkpoint,
        EncoderInfo(
            eval_pooler="cls_before_pooler", train_pooler="cls", max_seq_length=32, run_id="r1"
        ),
    )
    from_file = SentenceEncoder(str(checkpoint), device="cpu")
    assert (from_file.pooler, from_file.pooler_source) == ("cls_before_pooler", "encoder.json")
    assert from_file.describe()["run_id"] == "r1"
    overridden = SentenceEncoder(str(checkpoint), "first_last_mean", device="cpu")
    assert overridden.describe()["pooler_source"] == "argument"
    assert overridden.fingerprint != from_file.fingerprint
    with pytest.raises(EncoderError, match=r"no encoder\.json .* pass a pooler"):
        SentenceEncoder(str(tiny_bert), device="cpu")


def test_fingerprint_follows_weights_pooler_and_precision(tiny_bert: Path, tmp_path: Path) -> None:
    base = SentenceEncoder(str(tiny_bert), "mean", device="cpu")
    assert SentenceEncoder(str(tiny_bert), "mean", device="cpu").fingerprint == base.fingerprint
    other_weights = save_tiny_bert(tmp_path / "other", str(tiny_bert), seed=1)
    assert SentenceEncoder(str(other_weights), "mean", device="cpu").fingerprint != base.fingerprint
    assert SentenceEncoder(str(tiny_bert), "cls", device="cpu").fingerprint != base.fingerprint
    bf16 = SentenceEncoder(str(tiny_bert), "mean", device="cpu", precision="bf16")
    assert bf16.fingerprint != base.fingerprint


def test_a_runs_checkpoints_and_copies_of_them_have_their_own_fingerprints(
    tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's best and final share its run id (encoder.json); a folder outside the runs store
    that carries the same encoder.json (an exported or further-trained copy) may hold other
    weights: each is its own entry of the embedding cache, never another's."""
    monkeypatch.setattr(layout, "RUNS", tmp_path / "runs")
    info = EncoderInfo(
        eval_pooler="cls_before_pooler", train_pooler="cls", max_seq_length=32, run_id="r1"
    )
    folders = {
        "best": layout.run_dir("r1") / "best",
        "final": layout.run_dir("r1") / "final",
        "copy": tmp_path / "exported",
    }
    for seed, folder in enumerate(folders.values()):
        write_encoder_info(save_tiny_bert(folder, str(tiny_bert), seed=seed), info)
    prints = {
        name: SentenceEncoder(str(f), device="cpu").fingerprint for name, f in folders.items()
    }
    assert len(set(prints.values())) == 3
    assert SentenceEncoder(str(folders["best"]), device="cpu").fingerprint == prints["best"]
    write_encoder_info(save_tiny_bert(folders["copy"], str(tiny_bert), seed=5), info)
    assert SentenceEncoder(str(folders["copy"]), device="cpu").fingerprint != prints["copy"]


def test_fingerprint_follows_the_encoding_code(
    tiny_bert: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An edit of the encoding code (pooling, the packed forward) changes every fingerprint, so
    no embedding cache serves what the old code computed."""
    from stages.modeling import encoder as encoder_module

    base = SentenceEncoder(str(tiny_bert), "mean", device="cpu").fingerprint
    closure = encoder_module.code_identity(["stages.modeling.encoder"])
    assert "stages/modeling/pooling.py" in closure and "stages/modeling/unpadded.py" in closure
    edited = {**closure, "stages/modeling/pooling.py": "edited"}
    monkeypatch.setattr(encoder_module, "code_identity", lambda modules: edited)
    assert SentenceEncoder(str(tiny_bert), "mean", device="cpu").fingerprint != base


def test_nan_weights_fail_naming_the_model_and_a_sentence(tiny_bert: Path, tmp_path: Path) -> None:
    model = AutoModel.from_pretrained(tiny_bert)
    with torch.no_grad():
        model.embeddings.word_embeddings.weight[:] = float("nan")
    broken = tmp_path / "broken"
    model.save_pretrained(broken)
    AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(broken)
    encoder = SentenceEncoder(str(broken), "mean", device="cpu")
    with pytest.raises(EncoderError, match=r"broken produced a non-finite embedding, e\.g\. for '"):
        encoder(["fine words"])


def test_missing_pooler_weights_refuse_the_cls_pooler(tiny_bert: Path, tmp_path: Path) -> None:
    no_pooler = save_tiny_bert(tmp_path / "nopool", str(tiny_bert), pooler=False)
    with pytest.raises(EncoderError, match="pooler 'cls' needs the trained pooler"):
        SentenceEncoder(str(no_pooler), "cls", device="cpu")
    assert SentenceEncoder(str(no_pooler), "cls_before_pooler", device="cpu")(["x"]).shape == (
        1,
        32,
    )


@given(
    st.lists(st.integers(1, 6), max_size=60).map(sorted),
    st.integers(1, 9),
)
def test_length_batches_cover_the_rows_in_order_and_mostly_hold_one_length(
    lengths: list[int], batch_size: int
) -> None:
    batches = length_batches(np.array(lengths), batch_size)
    assert [i for start, stop in batches for i in range(start, stop)] == list(range(len(lengths)))
    quarter = max(1, batch_size // 4)
    for start, stop in batches:
        assert 0 < stop - start <= batch_size
        for i in range(start + 1, stop):  # a batch goes on past a length change only while short
            if lengths[i] != lengths[i - 1]:
                assert i - start < quarter
    for start, stop in batches[:-1]:  # cut early only at a length change, never below a quarter
        if stop - start < batch_size:
            assert lengths[stop] != lengths[stop - 1] and stop - start >= quarter


def test_sorted_sentences_are_batched_by_length() -> None:
    lengths = np.array([3] * 5 + [4] * 2 + [5] * 9 + [9])
    by_four = [(0, 4), (4, 5), (5, 7), (7, 11), (11, 15), (15, 16), (16, 17)]
    assert length_batches(lengths, 4) == by_four
    assert length_batches(lengths, 24) == [(0, 7), (7, 16), (16, 17)]  # 5 and 2 rows share one
    assert length_batches(np.array([], dtype=int), 4) == []
