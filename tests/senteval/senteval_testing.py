"""Helpers for the SentEval protocol tests: a synthetic SentEval data tree with every task's
format quirks, and a deterministic bag-of-words encoder that records what it encodes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from stages.senteval_protocol.loaders import BINARY_FILES, STS_YEARS

CLASS_WORDS = {  # a keyword per class; the encoder can separate classes through them
    2: ("great", "awful"),
    6: ("acronym", "describe", "thing", "person", "place", "number"),
}
FILLER = ["the", "a", "movie", "plot", "some", "really", "of", "it", "was", "and", "story", "very"]


def word_vector(word: str, dim: int) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(word.encode()).digest()[:8], "little")
    return np.random.default_rng(seed).normal(size=dim)


class BagOfWords:
    """Sum of fixed random word vectors; records every batch it is asked to encode."""

    def __init__(self, dim: int = 24) -> None:
        self.dim = dim
        self.calls: list[list[str]] = []

    def __call__(self, sentences: list[str]) -> np.ndarray:
        self.calls.append(list(sentences))
        rows = [
            sum((word_vector(w, self.dim) for w in s.split()), np.zeros(self.dim))
            for s in sentences
        ]
        return np.array(rows, dtype=np.float32)

    @property
    def encoded(self) -> list[str]:
        return [s for call in self.calls for s in call]


def _sentences(label: int, nclasses: int, n: int, rng: np.random.Generator) -> list[str]:
    keyword = CLASS_WORDS[nclasses][label]
    out = []
    for i in range(n):
        words = list(rng.choice(FILLER, size=int(rng.integers(2, 9))))
        if rng.random() < 0.85:  # some noise, so accuracy is high but not trivially perfect
            words.insert(int(rng.integers(0, len(words) + 1)), keyword)
        out.append(" ".join([*words, f"w{i}"]))
    return out


def write_senteval_tree(root: Path, n: int = 40, seed: int = 0) -> Path:
    """A tiny SentEval data root (``root/downstream/...``) with every task's files and quirks:
    unscored STS pairs, latin-1 text, a BOM'd MRPC header, the SICK header, an empty CR line."""
    rng = np.random.default_rng(seed)
    down = root / "downstream"

    def write(relative: str, lines: list[str], encoding: str = "utf-8", bom: bool = False) -> None:
        path = down / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        data = "".join(line + "\n" for line in lines).encode(encoding)
        path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + data)

    def scored_pairs(count: int) -> list[tuple[str, str, float]]:
        pairs = []
        for i in range(count):
            a = _sentences(0, 2, 1, rng)[0]
            keep = int(rng.integers(0, 4))
            b = " ".join(a.split()[: keep + 1] + list(rng.choice(FILLER, size=3)))
            pairs.append((a + f" p{i}", b, float(keep + 1 + (i % 2) * 0.4)))
        return pairs

    for year, subsets in STS_YEARS.items():
        for name in subsets:
            pairs = scored_pairs(12)
            write(f"STS/{year}-en-test/STS.input.{name}.txt", [f"{a}\t{b}" for a, b, _ in pairs])
            gold = [f"{s:.3f}" for _, _, s in pairs]
            gold[3] = ""  # an unscored pair
            write(f"STS/{year}-en-test/STS.gs.{name}.txt", gold)
    for split in ("train", "dev", "test"):
        rows = [
            f"main-captions\tMSRvid\t2012test\t{i:04d}\t{s:.3f}\t{a}\t{b}"
            for i, (a, b, s) in enumerate(scored_pairs(30))
        ]
        write(f"STS/STSBenchmark/sts-{split}.csv", rows)
    for fname in ("train", "trial", "test_annotated"):
        rows = [f"{i}\t{a}\t{b}\t{s:.1f}\tNEUTRAL" for i, (a, b, s) in enumerate(scored_pairs(20))]
        write(f"SICK/SICK_{fname}.txt", ["pair_ID\tsentence_A\tsentence_B\tscore\tentail", *rows])

    for pos, neg in BINARY_FILES.values():
        write(pos, [*_sentences(0, 2, n, rng), "caf\xe9 great"], encoding="latin-1")
        write(neg, [*_sentences(1, 2, n, rng), ""], encoding="latin-1")  # an empty line
    for split, size in (("train", 3 * n), ("dev", n), ("test", n)):
        lines = [
            f"{s} \t{label}" for label in (0, 1) for s in _sentences(1 - label, 2, size // 2, rng)
        ]
        write(f"SST/binary/sentiment-{split}", lines)
    names = ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM")
    for fname, size in (("train_5500.label", n // 2), ("TREC_10.label", n // 4)):
        lines = [
            f"{coarse}:fine {s} ?"
            for label, coarse in enumerate(names)
            for s in _sentences(label, 6, size, rng)
        ]
        write(f"TREC/{fname}", lines, encoding="latin-1")
    for split, size in (("train", 2 * n), ("test", n)):
        rows = []
        for i in range(size):
            a = _sentences(0, 2, 1, rng)[0]
            same = i % 2
            b = a if same else _sentences(1, 2, 1, rng)[0]
            rows.append(f"{same}\t{i}\t{i + 1000}\t{a}\t{b}")
        write(
            f"MRPC/msr_paraphrase_{split}.txt",
            ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String", *rows],
            bom=True,
        )
    return root


def save_tiny_bert(
    folder: Path, tokenizer_path: str, seed: int = 0, pooler: bool = True, positions: int = 512
) -> Path:
    """A randomly initialised 2-layer BERT with the real MiniLM tokenizer, saved as a model dir."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=positions,
    )
    torch.manual_seed(seed)
    BertModel(config, add_pooling_layer=pooler).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
