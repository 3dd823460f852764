"""Helpers of the MTEB stage tests: tiny random encoders and tiny local STS folders."""

from __future__ import annotations

from pathlib import Path

import numpy as np

WORDS = ("man", "woman", "dog", "cat", "plays", "runs", "eats", "guitar", "ball", "park", "red")


def save_tiny_bert(
    folder: Path, tokenizer_path: str, seed: int = 0, run_id: str | None = None
) -> Path:
    """A randomly initialised 2-layer BERT with the real MiniLM tokenizer; with ``run_id``, a
    trained-checkpoint directory (encoder.json: mean pooling, that run id)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from stages.modeling.checkpoint import EncoderInfo, write_encoder_info

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
    )
    torch.manual_seed(seed)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    if run_id is not None:
        info = EncoderInfo(eval_pooler="mean", train_pooler="cls", max_seq_length=32, run_id=run_id)
        write_encoder_info(folder, info)
    return folder


def sentence_pairs(n: int, seed: int = 0) -> list[tuple[str, str, float]]:
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(n):
        a = " ".join(rng.choice(WORDS, size=rng.integers(3, 9)))
        b = " ".join(rng.choice(WORDS, size=rng.integers(3, 9)))
        pairs.append((a, b, round(float(rng.uniform(0, 5)), 3)))
    return pairs


def write_stsb(sts_raw: Path, n: int = 40, seed: int = 0) -> Path:
    """``sts_raw/stsbenchmark/sts-test.csv`` with ``n`` pairs; every third line has the two
    trailing source columns of the real file."""
    folder = sts_raw / "stsbenchmark"
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, (a, b, score) in enumerate(sentence_pairs(n, seed)):
        sources = "\tsource one\tsource two" if i % 3 == 0 else ""
        lines.append(f"main-captions\tMSRvid\t2012test\t{i:04d}\t{score}\t{a}\t{b}{sources}")
    (folder / "sts-test.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return sts_raw
