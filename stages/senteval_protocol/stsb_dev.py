"""The STS-B dev score a trainer selects checkpoints with: the evaluator's own STS code on the
dev split, plus alignment and uniformity of the same embeddings (cheap, and the papers plot them
along training)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from stages.senteval_protocol.embeddings import EmbeddingTable, Encode
from stages.senteval_protocol.loaders import downstream_dir, load_stsb_dev
from stages.senteval_protocol.sts import alignment_uniformity, correlations, cosine_similarities


@dataclass(frozen=True)
class DevScores:
    spearman: float  # x100
    pearson: float  # x100
    alignment: float
    uniformity: float


class StsbDevEvaluation:
    """Load STS-B dev once; ``evaluation(encode)`` encodes its distinct sentences once and scores.

    ``encode`` is any ``list[str] -> (n, d) array`` (e.g. ``stages.modeling.encoder.embed`` with
    a model in eval mode and its pooler); ``batch_size`` sentences are passed per call, or all
    3,000 at once with None (for an encode that batches by token length itself).
    """

    def __init__(self, data_dir: str | Path, batch_size: int | None = 128) -> None:
        self.pairs = load_stsb_dev(downstream_dir(data_dir))
        self.batch_size = batch_size

    def __call__(self, encode: Encode) -> DevScores:
        table = EmbeddingTable(encode, self.batch_size, cache=None, empty_sentence="")
        table.add("STSBenchmark-dev", self.pairs.sent1 + self.pairs.sent2)
        a, b = table(self.pairs.sent1), table(self.pairs.sent2)
        scores = correlations(cosine_similarities(a, b), self.pairs.scores)
        geometry = alignment_uniformity(a, b, self.pairs.scores)
        return DevScores(
            spearman=scores["spearman"],
            pearson=scores["pearson"],
            alignment=geometry["alignment"],
            uniformity=geometry["uniformity"],
        )
