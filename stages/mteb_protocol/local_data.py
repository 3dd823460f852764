"""Local copies of MTEB's STS datasets, for machines without Hugging Face hub access.

Two sources (params.yaml ``mteb.local_source``):

- ``senteval`` (default): STS12-16 and SICK-R from the SentEval copies (``data/senteval``),
  STSBenchmark from the STS Benchmark csv (``data/sts_raw/stsbenchmark``). MTEB's hub datasets
  ``mteb/sts12-sts`` .. ``mteb/sts16-sts`` hold SentEval's Moses-tokenised text: every
  descriptive statistic mteb ships for them matches these files (pair count, characters, unique
  texts, min/max lengths, mean score; statistics cannot show letter case, SentEval's is lower),
  and ``mteb/stsbenchmark-sts`` is the raw csv. SICK-R: SentEval's three SICK files are MTEB's
  9,927 pairs with the same scores, but tokenised (a space before most commas and possessives:
  0.1% more characters).
- ``sts_raw``: STS12-16 and STSBenchmark from the original, untokenised SemEval files
  (``data/sts_raw``). Same pairs and scores as MTEB's, different text (1.8-2.5% fewer characters in
  STS12-16), hence slightly different scores for some models; no SICK-R.

Every loaded dataset is compared with the statistics mteb records for the hub dataset and the
comparison goes into the results. Files are split on ``\\n`` only (a trailing ``\\r`` is
dropped): ``str.splitlines`` would also split on the rare Unicode separators inside sentences.
Gold files have one line per input pair; an empty gold line is an unscored pair and is dropped.
A missing folder means "no local copy" (the task falls back to the hub); a folder with missing or
malformed files raises ``LocalDataError`` naming the file and line.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

from stages.core.schema.evaluation_settings import MtebLocalSource as LocalSource
from stages.senteval_protocol.loaders import STS_YEARS

LOCAL_SOURCES: tuple[LocalSource, ...] = get_args(LocalSource)
SCORE_RANGE = (0.0, 5.0)

# task -> (folder under the source root, file prefix); subsets are SentEval's STS_YEARS
_SEMEVAL_FOLDERS: dict[str, dict[str, tuple[str, str]]] = {
    "senteval": {year: (f"downstream/STS/{year}-en-test", "STS") for year in STS_YEARS},
    "sts_raw": {
        "STS12": ("STS2012-en-test", "STS"),
        "STS13": ("STS2013-en-test", "STS"),  # the LDC-licensed SMT subset is absent, as in MTEB
        "STS14": ("STS2014-en-test", "STS"),
        "STS15": ("STS2015-en-test", "STS"),
        "STS16": ("STS2016-en-test", "STS2016"),  # 4 columns: s1, s2, source1, source2
    },
}
STSB_TEST = "stsbenchmark/sts-test.csv"  # under the sts_raw root, in both sources
SICK_FILES = ("SICK_train.txt", "SICK_trial.txt", "SICK_test_annotated.txt")  # 4,500+500+4,927


class LocalDataError(ValueError):
    """A local dataset file is missing or malformed; the message names the file and line."""


@dataclass(frozen=True)
class LocalPairs:
    """The scored pairs of one STS test set, with what they were read from."""

    task: str
    source: LocalSource
    sentence1: list[str]
    sentence2: list[str]
    score: list[float]
    files: tuple[str, ...]
    sha256: str  # over the relative names and bytes of ``files``

    @property
    def revision(self) -> str:
        """Stands in for the hub dataset revision (results and mteb's cache record it)."""
        return f"local-{self.source}-{self.sha256[:12]}"

    def __len__(self) -> int:
        return len(self.score)


def local_tasks(source: LocalSource) -> tuple[str, ...]:
    """The tasks that ``source`` has a local copy of."""
    years = tuple(_SEMEVAL_FOLDERS[source])
    return (*years, "STSBenchmark", *(("SICK-R",) if source == "senteval" else ()))


def local_root(task: str, source: LocalSource, sts_raw_dir: Path, senteval_dir: Path) -> Path:
    """The folder that must exist for ``task`` to be read locally."""
    if task == "STSBenchmark":
        return sts_raw_dir / Path(STSB_TEST).parent
    if task == "SICK-R":
        return senteval_dir / "downstream" / "SICK"
    root = senteval_dir if source == "senteval" else sts_raw_dir
    return root / _SEMEVAL_FOLDERS[source][task][0]


def local_paths(
    task: str, source: LocalSource, sts_raw_dir: Path, senteval_dir: Path
) -> list[Path]:
    """The files (or folder) a local task reads: what the stage verifies before it starts."""
    root = local_root(task, source, sts_raw_dir, senteval_dir)
    if task == "STSBenchmark":
        return [sts_raw_dir / STSB_TEST]
    if task == "SICK-R":
        return [root / name for name in SICK_FILES]
    return [root]


def load_local_pairs(
    task: str, source: LocalSource, sts_raw_dir: str | Path, senteval_dir: str | Path
) -> LocalPairs | None:
    """``task``'s test pairs from local files; None when this source has no copy of it or its
    folder is absent (not downloaded)."""
    sts_raw_dir, senteval_dir = Path(sts_raw_dir), Path(senteval_dir)
    if task not in local_tasks(source):
        return None
    root = local_root(task, source, sts_raw_dir, senteval_dir)
    if not root.is_dir():
        return None
    reader = _Reader(root)
    if task == "STSBenchmark":
        columns = _read_stsb(reader, root / Path(STSB_TEST).name)
    elif task == "SICK-R":
        columns = _read_sick(reader, root)
    else:
        columns = _read_semeval_year(reader, root, task, _SEMEVAL_FOLDERS[source][task][1])
    return LocalPairs(task, source, *columns, tuple(reader.names), reader.sha256())


def compare_with_hub_statistics(pairs: LocalPairs, hub: dict[str, Any]) -> dict[str, Any]:
    """Local vs hub descriptive statistics (mteb's ``descriptive_stats['test']``)."""
    ours = _statistics(pairs)
    theirs = {
        "num_samples": hub["num_samples"],
        "mean_score": hub["label_statistics"]["avg_score"],
    }
    for side in ("text1", "text2"):
        text = hub[f"{side}_statistics"]
        theirs |= {
            f"{side}_characters": text["total_text_length"],
            f"{side}_unique_texts": text["unique_texts"],
            f"{side}_min_length": text["min_text_length"],
            f"{side}_max_length": text["max_text_length"],
        }
    differences = {
        key: [ours[key], theirs[key]]
        for key in theirs
        if not _same(ours[key], theirs[key], key == "mean_score")
    }
    return {"matches_hub_statistics": not differences, "differences_local_vs_hub": differences}


def _statistics(pairs: LocalPairs) -> dict[str, Any]:
    stats: dict[str, Any] = {
        "num_samples": len(pairs),
        "mean_score": sum(pairs.score) / len(pairs),
    }
    for side, texts in (("text1", pairs.sentence1), ("text2", pairs.sentence2)):
        lengths = [len(t) for t in texts]
        stats |= {
            f"{side}_characters": sum(lengths),
            f"{side}_unique_texts": len(set(texts)),
            f"{side}_min_length": min(lengths),
            f"{side}_max_length": max(lengths),
        }
    return stats


def _same(a: float, b: float, approximate: bool) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(b)) if approximate else a == b


class _Reader:
    """Reads files under one root and remembers their names and bytes for a checksum."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.names: list[str] = []
        self.digest = hashlib.sha256()

    def lines(self, path: Path) -> list[str]:
        if not path.is_file():
            raise LocalDataError(f"{path}: missing (the rest of {self.root} is there)")
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            line = raw[: err.start].count(b"\n") + 1
            raise LocalDataError(f"{path}:{line}: not valid utf-8: {err.reason}") from None
        name = str(path.relative_to(self.root))
        self.names.append(name)
        self.digest.update(name.encode() + b"\0" + raw + b"\0")
        lines = [line.removesuffix("\r") for line in text.split("\n")]
        return lines[:-1] if lines and lines[-1] == "" else lines

    def sha256(self) -> str:
        return self.digest.hexdigest()


Columns = tuple[list[str], list[str], list[float]]


def _score(value: str, path: Path, line: int) -> float:
    try:
        score = float(value)
    except ValueError:
        raise LocalDataError(f"{path}:{line}: score {value!r} is not a number") from None
    low, high = SCORE_RANGE
    if not low <= score <= high:
        raise LocalDataError(f"{path}:{line}: score {score} outside [{low:g}, {high:g}]")
    return score


def _fields(line: str, path: Path, number: int, minimum: int, what: str) -> list[str]:
    fields = line.split("\t")
    if len(fields) < minimum:
        raise LocalDataError(
            f"{path}:{number}: expected at least {minimum} tab-separated fields ({what}), "
            f"found {len(fields)}"
        )
    return fields


def _read_semeval_year(reader: _Reader, root: Path, task: str, prefix: str) -> Columns:
    sentence1, sentence2, scores = [], [], []
    for subset in STS_YEARS[task]:
        input_path = root / f"{prefix}.input.{subset}.txt"
        gold_path = root / f"{prefix}.gs.{subset}.txt"
        inputs, gold = reader.lines(input_path), reader.lines(gold_path)
        if len(gold) != len(inputs):
            raise LocalDataError(
                f"{gold_path}: {len(gold)} lines but {input_path} has {len(inputs)} "
                "(one score or empty line per sentence pair expected)"
            )
        for number, (line, value) in enumerate(zip(inputs, gold, strict=True), start=1):
            fields = _fields(line, input_path, number, 2, "a sentence pair")
            if not value.strip():  # an unscored pair
                continue
            scores.append(_score(value.strip(), gold_path, number))
            sentence1.append(fields[0])
            sentence2.append(fields[1])
    return sentence1, sentence2, scores


def _read_stsb(reader: _Reader, path: Path) -> Columns:
    # genre, file, year, id, score, sentence1, sentence2 (and on some lines 2 source columns)
    sentence1, sentence2, scores = [], [], []
    for number, line in enumerate(reader.lines(path), start=1):
        fields = _fields(line, path, number, 7, "genre, file, year, id, score, s1, s2")
        scores.append(_score(fields[4], path, number))
        sentence1.append(fields[5])
        sentence2.append(fields[6])
    return sentence1, sentence2, scores


def _read_sick(reader: _Reader, root: Path) -> Columns:
    # header, then pair_ID, sentence_A, sentence_B, relatedness_score, entailment_judgment
    sentence1, sentence2, scores = [], [], []
    for name in SICK_FILES:
        path = root / name
        for number, line in enumerate(reader.lines(path)[1:], start=2):
            fields = _fields(line, path, number, 4, "pair id, sentence A, sentence B, score")
            scores.append(_score(fields[3], path, number))
            sentence1.append(fields[1])
            sentence2.append(fields[2])
    return sentence1, sentence2, scores
