"""docs/senteval.md's conformance table is the side-by-side benchmark's recorded results
(``python -m benchmarks.senteval_side_by_side --write-docs``), never a hand-edited copy; checked
here without running the benchmark (it needs SentEval and takes a quarter of an hour)."""

from __future__ import annotations

from benchmarks.senteval_side_by_side import (
    DOC,
    conformance_table,
    recorded_runs,
    with_conformance_table,
)


def test_the_docs_table_is_the_recorded_runs() -> None:
    runs = recorded_runs()
    assert "distinct" in runs
    text = DOC.read_text(encoding="utf-8")
    assert with_conformance_table(text, runs) == text, (
        "docs/senteval.md's conformance table is stale: "
        "python -m benchmarks.senteval_side_by_side --write-docs"
    )


def _row(ours: float, peer: float) -> dict[str, float]:
    return {"ours": ours, "senteval_same_embeddings": ours, "senteval_simcse_batcher": peer}


def test_each_encoding_is_compared_with_its_own_runs_senteval_at_the_printed_digit() -> None:
    runs = {
        "distinct": {
            "parity": {"STS12": _row(72.3716, 72.3691), "CR": _row(82.07, 82.07)},
            "meta": {"date": "2026-11-28T15:00:00+00:00", "commit": "abc1234"},
        },
        "senteval_batches": {
            "parity": {"STS12": _row(72.3691, 72.3691)},
            "parity_sts_subsets": {
                "STS12 mean": _row(70.0149, 70.0149),
                "STS12 surprise.SMTnews": _row(59.126, 59.134),
            },
        },
    }
    lines = conformance_table(runs).splitlines()
    assert (
        lines[0]
        == "| task | SentEval | ours, `distinct` | diff | ours, `senteval_batches` | diff |"
    )
    assert lines[2:6] == [
        "| STS12 (all) | 72.37 | 72.37 | 0.00 | 72.37 | 0.00 |",
        "| STS12 (mean) | 70.01 |  |  | 70.01 | 0.00 |",  # the distinct run has no subsets
        "| &nbsp;&nbsp;STS12 surprise.SMTnews | 59.13 |  |  | 59.13 | 0.00 |",
        "| CR | 82.07 | 82.07 | 0.00 |  |  |",
    ]
    assert lines[-1] == (
        "From `senteval_side_by_side.json` (2026-11-28, commit abc1234), "
        "`senteval_side_by_side_senteval_batches.json` (recorded before dates were)."
    )
