"""The two encodings of the SentEval protocol (``evaluations.senteval.encoding``).

``distinct`` encodes each distinct sentence once: both sides of a pair of identical sentences get
the same row, so they tie exactly. ``senteval_batches`` sends the encoder SentEval's own batches
(every occurrence, each task in its own sorted batches): with an encoder whose rows move in the
last bits with their batch's padding, as a padded transformer's do, identical sentences need not
tie, exactly as in SentEval. The reference is SentEval's own code, transcribed from
``senteval/{sts,binary,trec,sst,mrpc}.py`` (SimCSE's copy, whose STS-B and SICK-R are
``STSEval`` without sorting).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import pearsonr, spearmanr
from senteval_testing import save_tiny_bert, word_vector

from stages.senteval_protocol.embeddings import EmbeddingTable
from stages.senteval_protocol.loaders import STS_YEARS, load_task
from stages.senteval_protocol.protocol import evaluate
from stages.senteval_protocol.senteval_batches import SentEvalBatches

TREC = {"ABBR": 0, "DESC": 1, "ENTY": 2, "HUM": 3, "LOC": 4, "NUM": 5}
BATCH = 7  # small, so that every task spans several batches


class PaddingSensitive:
    """A bag-of-words encoder whose rows move in the last float32 bits with the padding of their
    batch (the batch's longest sentence minus their own length), as a padded forward's do;
    records every batch it is sent."""

    def __init__(self, dim: int = 16) -> None:
        self.dim = dim
        self.calls: list[list[str]] = []

    def __call__(self, sentences: list[str]) -> np.ndarray:
        self.calls.append(list(sentences))
        longest = max(len(s.split()) for s in sentences)
        rows = np.array(
            [
                sum((word_vector(w, self.dim) for w in s.split()), np.zeros(self.dim))
                for s in sentences
            ]
        )
        rows[:, 0] += 1e-6 * np.array([longest - len(s.split()) for s in sentences])
        return rows.astype(np.float32)


# SentEval, transcribed: each task's loader and the batching loop of its run method


def _lines(path: Path, encoding: str) -> list[str]:
    with open(path, encoding=encoding) as f:
        return f.read().splitlines()


def _chunks(samples: list[list[str]], bs: int) -> list[list[str]]:
    return [[" ".join(s) for s in samples[i : i + bs]] for i in range(0, len(samples), bs)]


def _sts_data(down: Path, task: str) -> dict[str, tuple[list, list, list]]:
    """STSEval.loadFile (STS12-16: sorted) or SimCSE's STSBenchmarkEval / SICKRelatednessEval
    loadFile (file order; dev and test, the splits the protocol scores)."""
    data = {}
    if task in STS_YEARS:
        folder = down / "STS" / f"{task}-en-test"
        for dataset in STS_YEARS[task]:
            pairs = [
                line.split("\t") for line in _lines(folder / f"STS.input.{dataset}.txt", "utf8")
            ]
            raw = np.array(_lines(folder / f"STS.gs.{dataset}.txt", "utf8"))
            keep = raw != ""
            gs = [float(x) for x in raw[keep]]
            sent1 = np.array([a.split() for a, _ in pairs], dtype=object)[keep]
            sent2 = np.array([b.split() for _, b in pairs], dtype=object)[keep]
            ordered = sorted(
                zip(sent1, sent2, gs, strict=True), key=lambda z: (len(z[0]), len(z[1]), z[2])
            )
            data[dataset] = tuple(map(list, zip(*ordered, strict=True)))
        return data
    if task == "STSBenchmark":
        files, columns, header = {"dev": "sts-dev.csv", "test": "sts-test.csv"}, (5, 6, 4), False
        folder = down / "STS" / "STSBenchmark"
    else:
        files = {"dev": "SICK_trial.txt", "test": "SICK_test_annotated.txt"}
        folder, columns, header = down / "SICK", (1, 2, 3), True
    for split, name in files.items():
        with open(folder / name, encoding="utf-8") as f:
            rows = [line.strip().split("\t") for line in f][1 if header else 0 :]
        a, b, y = columns
        data[split] = ([r[a].split() for r in rows], [r[b].split() for r in rows],
                       [float(r[y]) for r in rows])  # fmt: skip
    return data


def _senteval_sts(down: Path, task: str, batcher, bs: int = BATCH) -> dict[str, float]:
    """STSEval.run: per chunk of pairs, batcher(first sentences), batcher(second sentences),
    SentEval's cosine per pair; Spearman x100 per subset and over all (STS12-16)."""
    spearman, all_sys, all_gs = {}, [], []
    for dataset, (input1, input2, gs) in _sts_data(down, task).items():
        sys_scores = []
        for ii in range(0, len(gs), bs):
            enc1 = batcher([" ".join(s) for s in input1[ii : ii + bs]])
            enc2 = batcher([" ".join(s) for s in input2[ii : ii + bs]])
            for kk in range(enc2.shape[0]):
                u, v = enc1[kk], enc2[kk]
                sys_scores.append(
                    np.nan_to_num(np.dot(u, v) / (np.linalg.norm(u) * np.linalg.norm(v)))
                )
        spearman[dataset] = 100 * float(spearmanr(sys_scores, gs)[0])
        all_sys += sys_scores
        all_gs += gs
    if task in STS_YEARS:
        spearman["all"] = 100 * float(spearmanr(all_sys, all_gs)[0])
        spearman["all_pearson"] = 100 * float(pearsonr(all_sys, all_gs)[0])
    return spearman


def _senteval_transfer_batches(down: Path, task: str, bs: int = BATCH) -> list[list[str]]:
    """The batches of BinaryClassifierEval (CR), TRECEval, SSTEval and MRPCEval's run."""
    by_length_label = lambda z: (len(z[0]), z[1])  # noqa: E731
    if task == "CR":
        pos = [line.split() for line in _lines(down / "CR" / "custrev.pos", "latin-1")]
        neg = [line.split() for line in _lines(down / "CR" / "custrev.neg", "latin-1")]
        ordered = sorted(
            zip(pos + neg, [1] * len(pos) + [0] * len(neg), strict=True), key=by_length_label
        )
        return _chunks([x for x, _ in ordered], bs)
    batches = []
    if task == "TREC":
        for name in ("train_5500.label", "TREC_10.label"):
            with open(down / "TREC" / name, encoding="latin-1") as f:
                targets = [line.strip().split(":", 1) for line in f]
            xy = [(s.split(" ", 1)[1].split(), TREC[t]) for t, s in targets]
            batches += _chunks([x for x, _ in sorted(xy, key=by_length_label)], bs)
    elif task == "SST2":
        for split in ("train", "dev", "test"):
            with open(down / "SST" / "binary" / f"sentiment-{split}", encoding="utf-8") as f:
                xy = [(s[0].split(), int(s[1])) for s in (line.strip().split("\t") for line in f)]
            batches += _chunks([x for x, _ in sorted(xy, key=by_length_label)], bs)
    else:  # MRPC
        for split in ("train", "test"):
            with open(down / "MRPC" / f"msr_paraphrase_{split}.txt", encoding="utf-8") as f:
                rows = [line.strip().split("\t") for line in f][1:]
            abz = sorted(((r[3].split(), r[4].split(), int(r[0])) for r in rows),
                         key=lambda z: (len(z[0]), len(z[1]), z[2]))  # fmt: skip
            batches += _chunks([a for a, _, _ in abz], bs) + _chunks([b for _, b, _ in abz], bs)
    return batches


@pytest.mark.parametrize("task", ["STS12", "STSBenchmark", "SICKRelatedness"])
def test_sts_batches_and_scores_are_sentevals(senteval_root: Path, task: str) -> None:
    down = senteval_root / "downstream"
    reference_encoder, ours = PaddingSensitive(), PaddingSensitive()
    reference = _senteval_sts(down, task, reference_encoder)
    out = evaluate(ours, [task], senteval_root, "fasttest", batch_size=BATCH,
                   encoding="senteval_batches")  # fmt: skip
    assert ours.calls == reference_encoder.calls  # the same batches, in the same order
    result = out["tasks"][task]
    if task in STS_YEARS:
        assert {d: result["subsets"][d]["spearman"] for d in STS_YEARS[task]} | {
            "all": result["all"]["spearman"],
            "all_pearson": result["all"]["pearson"],
        } == reference  # to the bit
    else:
        assert {s: result[s]["spearman"] for s in ("dev", "test")} == reference
    assert out["protocol"]["encoding"] == "senteval_batches"
    assert out["timings"]["tasks"][task]["embeddings"] == "encoded"


@pytest.mark.parametrize("task", ["CR", "TREC", "SST2", "MRPC"])
def test_transfer_batches_are_sentevals(senteval_root: Path, task: str) -> None:
    encoder = PaddingSensitive()
    batches = SentEvalBatches(encoder, BATCH, empty_sentence="")
    loaded = load_task(senteval_root / "downstream", task)
    assert batches.add(loaded) is loaded  # the loaders return SentEval's order
    # SentEval's batcher gets the empty CR line as '' (SimCSE's batcher joins no tokens)
    assert encoder.calls == _senteval_transfer_batches(senteval_root / "downstream", task)
    for split in loaded.splits.values():  # one row per occurrence, in the split's order
        for column in split.columns:
            assert batches(column).shape == (len(column), encoder.dim)


def _identical_pairs_tree(root: Path, n: int = 60) -> Path:
    """STS12 whose SMTeuroparl is mostly pairs of one sentence twice (lengths 2-9 words), gold
    scores spread over them; the other subsets ordinary pairs."""
    rng = np.random.default_rng(1)
    words = [f"w{i}" for i in range(40)]
    folder = root / "downstream" / "STS" / "STS12-en-test"
    folder.mkdir(parents=True)
    for name in STS_YEARS["STS12"]:
        pairs = []
        for i in range(n):
            a = " ".join(rng.choice(words, size=int(rng.integers(2, 10))))
            same = name == "SMTeuroparl" and i % 4
            pairs.append(
                (a, a if same else " ".join(rng.choice(words, size=int(rng.integers(2, 10)))))
            )
        (folder / f"STS.input.{name}.txt").write_text("".join(f"{a}\t{b}\n" for a, b in pairs))
        gold = rng.uniform(0, 5, n).round(1)
        (folder / f"STS.gs.{name}.txt").write_text("".join(f"{g}\n" for g in gold))
    return root


def test_identical_sentences_tie_in_distinct_and_need_not_in_senteval_batches(tmp_path) -> None:
    root = _identical_pairs_tree(tmp_path / "senteval")
    task = load_task(root / "downstream", "STS12")
    part = next(p for p in task.parts if p.name == "SMTeuroparl")
    identical = np.array([a == b for a, b in zip(part.sent1, part.sent2, strict=True)])
    assert identical.sum() == 45

    table = EmbeddingTable(PaddingSensitive(), BATCH, None, empty_sentence="")
    table.add("STS12", task.texts)
    # distinct: one row per sentence, so both sides of an identical pair are the same bits
    np.testing.assert_array_equal(table(part.sent1)[identical], table(part.sent2)[identical])

    batches = SentEvalBatches(PaddingSensitive(), BATCH, empty_sentence="")
    ordered = next(p for p in batches.add(task).parts if p.name == "SMTeuroparl")
    same = np.array([a == b for a, b in zip(ordered.sent1, ordered.sent2, strict=True)])
    u, v = batches(ordered.sent1)[same], batches(ordered.sent2)[same]
    # SentEval's batches: each side padded by its own batch, so many identical pairs differ
    differing = (u != v).any(axis=1)
    assert 0 < differing.sum() < len(u)
    # and the near-1 cosines they rank by no longer tie
    cosines = [
        np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)) for a, b in zip(u, v, strict=True)
    ]
    assert len(set(cosines)) > 1

    reference = _senteval_sts(root / "downstream", "STS12", PaddingSensitive())
    results = {
        encoding: evaluate(
            PaddingSensitive(), ["STS12"], root, "fasttest", batch_size=BATCH, encoding=encoding
        )["tasks"]["STS12"]
        for encoding in ("distinct", "senteval_batches")
    }
    smt = {e: r["subsets"]["SMTeuroparl"]["spearman"] for e, r in results.items()}
    assert smt["senteval_batches"] == reference["SMTeuroparl"]
    assert smt["distinct"] != reference["SMTeuroparl"]  # the near-ties rank otherwise
    # the subsets without identical pairs agree to float rounding in both
    for name in ("MSRpar", "MSRvid"):
        got = results["distinct"]["subsets"][name]["spearman"]
        assert got == pytest.approx(reference[name], abs=1e-9)


def test_senteval_batches_need_a_batch_size(senteval_root: Path) -> None:
    with pytest.raises(ValueError, match="batch_size"):
        evaluate(PaddingSensitive(), ["STS12"], senteval_root, batch_size=None,
                 encoding="senteval_batches")  # fmt: skip
    with pytest.raises(ValueError, match="unknown encoding"):
        evaluate(PaddingSensitive(), ["STS12"], senteval_root, encoding="sorted")


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory, minilm_path: str) -> Path:
    return save_tiny_bert(tmp_path_factory.mktemp("tiny") / "model", minilm_path)


@pytest.mark.parametrize("pooler", ["mean", "cls", "cls_before_pooler", "first_last_mean"])
def test_encode_batch_is_simcses_batcher(tiny_bert: Path, pooler: str) -> None:
    """One padded forward of the batch as given, pooled as SimCSE's evaluation.py pools
    ('avg', 'cls', 'cls_before_pooler', 'avg_first_last'), every occurrence encoded."""
    from stages.modeling.encoder import SentenceEncoder

    encoder = SentenceEncoder(str(tiny_bert), pooler, device="cpu")
    batch = ["a short one", "a much longer sentence than the first one is", "a short one", ""]
    rows = encoder.encode_batch(batch)

    inputs = encoder.tokenizer(batch, return_tensors="pt", padding=True)  # batch_encode_plus
    with torch.no_grad():
        out = encoder.model(**inputs, output_hidden_states=True, return_dict=True)
    mask = inputs["attention_mask"]
    expected = {
        "mean": (out.last_hidden_state * mask.unsqueeze(-1)).sum(1) / mask.sum(-1).unsqueeze(-1),
        "cls": out.pooler_output,
        "cls_before_pooler": out.last_hidden_state[:, 0],
        "first_last_mean": ((out.hidden_states[1] + out.hidden_states[-1]) / 2.0
                            * mask.unsqueeze(-1)).sum(1) / mask.sum(-1).unsqueeze(-1),
    }[pooler]  # fmt: skip
    np.testing.assert_array_equal(rows, expected.numpy())
    assert rows.dtype == np.float32 and rows.shape == (4, 32)
