"""Reading SentEval's task files exactly as SentEval (facebookresearch/SentEval, as shipped with
SimCSE) reads them: the same files, encodings, columns, dropped lines and sample order.

Sentences are SentEval's whitespace tokens joined with single spaces, which is the text SimCSE's
batcher hands to the backbone's tokenizer. The sample order matters for the transfer tasks: SentEval
sorts samples by length before encoding them, and its cross-validation folds and training
permutations index that sorted order, so the loaders return it.

Every problem (missing file, malformed line, undecodable byte) raises ``DataFormatError`` naming
the file and, where there is one, the line.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stages.core.schema.evaluation_settings import SENTEVAL_TASKS

STS_YEARS = {
    "STS12": ("MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"),
    # SentEval's STS13 has no SMT subset (LDC licence)
    "STS13": ("FNWN", "headlines", "OnWN"),
    "STS14": ("deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"),
    "STS15": ("answers-forums", "answers-students", "belief", "headlines", "images"),
    "STS16": ("answer-answer", "headlines", "plagiarism", "postediting", "question-question"),
}
# The folder under downstream/ each task reads (what the data check verifies before a run).
TASK_FOLDERS = {
    **{f"STS1{y}": f"STS/STS1{y}-en-test" for y in range(2, 7)},
    "STSBenchmark": "STS/STSBenchmark",
    "SICKRelatedness": "SICK",
    "SST2": "SST/binary",
    **{name: name for name in ("MR", "CR", "SUBJ", "MPQA", "TREC", "MRPC")},
}

BINARY_FILES = {  # (file of label 1, file of label 0), as SentEval passes them
    "MR": ("MR/rt-polarity.pos", "MR/rt-polarity.neg"),
    "CR": ("CR/custrev.pos", "CR/custrev.neg"),
    "SUBJ": ("SUBJ/subj.objective", "SUBJ/subj.subjective"),
    "MPQA": ("MPQA/mpqa.pos", "MPQA/mpqa.neg"),
}
TREC_LABELS = {"ABBR": 0, "DESC": 1, "ENTY": 2, "HUM": 3, "LOC": 4, "NUM": 5}


class DataFormatError(ValueError):
    """A SentEval data file is missing or malformed; the message names the file and line."""


@dataclass(frozen=True)
class DataFile:
    """A file a task read, recorded next to the results."""

    path: str  # relative to the downstream/ folder
    sha256: str
    lines: int


@dataclass(frozen=True)
class StsPairs:
    """Scored sentence pairs: one STS subset, or one split of STS-B / SICK-R."""

    name: str
    sent1: list[str]
    sent2: list[str]
    scores: np.ndarray  # float64 gold scores


@dataclass(frozen=True)
class StsTask:
    name: str
    parts: tuple[StsPairs, ...]
    files: tuple[DataFile, ...]

    @property
    def texts(self) -> list[str]:
        return [s for part in self.parts for s in (*part.sent1, *part.sent2)]


@dataclass(frozen=True)
class LabelledSplit:
    """Samples of one split in SentEval's order: one text column, or two for sentence pairs."""

    columns: tuple[list[str], ...]
    labels: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.labels)


@dataclass(frozen=True)
class TransferTask:
    """A classification task. ``splits`` is {"all"} for the cross-validated binary tasks,
    {"train", "test"} for TREC and MRPC, {"train", "dev", "test"} for SST2."""

    name: str
    nclasses: int
    splits: dict[str, LabelledSplit]
    files: tuple[DataFile, ...]

    @property
    def texts(self) -> list[str]:
        return [s for split in self.splits.values() for col in split.columns for s in col]


Task = StsTask | TransferTask


def join_tokens(text: str) -> str:
    """SentEval's whitespace tokens joined by single spaces (SimCSE's batcher input)."""
    return " ".join(text.split())


def downstream_dir(data_dir: str | Path) -> Path:
    """The ``downstream/`` folder of a SentEval data root, with a clear error if absent."""
    root = Path(data_dir)
    downstream = root / "downstream"
    if not downstream.is_dir():
        hint = " (pass its parent folder)" if root.name == "downstream" else ""
        raise DataFormatError(f"{root}: no downstream/ folder; expected a SentEval data root{hint}")
    return downstream


def load_task(downstream: Path, name: str) -> Task:
    if name in STS_YEARS:
        return _load_sts_year(downstream, name)
    loaders = {
        "STSBenchmark": _load_stsb,
        "SICKRelatedness": _load_sickr,
        "SST2": _load_sst2,
        "TREC": _load_trec,
        "MRPC": _load_mrpc,
    }
    if name in BINARY_FILES:
        return _load_binary(downstream, name)
    if name not in loaders:
        raise ValueError(f"unknown SentEval task '{name}'; known: {', '.join(SENTEVAL_TASKS)}")
    return loaders[name](downstream)


class _Reader:
    """Reads files under downstream/ and remembers what was read (path, checksum, lines)."""

    def __init__(self, downstream: Path, task: str) -> None:
        self.downstream = downstream
        self.task = task
        self.files: list[DataFile] = []

    def text(self, relative: str, encoding: str) -> tuple[Path, str]:
        path = self.downstream / relative
        if not path.is_file():
            raise DataFormatError(f"{path}: missing (needed by {self.task})")
        raw = path.read_bytes()
        try:
            text = raw.decode(encoding)
        except UnicodeDecodeError as err:
            line = raw[: err.start].count(b"\n") + 1
            raise DataFormatError(f"{path}:{line}: not valid {encoding}: {err.reason}") from None
        digest = hashlib.sha256(raw).hexdigest()
        self.files.append(DataFile(relative, digest, raw.count(b"\n")))
        return path, text

    def read_splitlines(self, relative: str, encoding: str) -> tuple[Path, list[str]]:
        """SentEval's ``f.read().splitlines()``."""
        path, text = self.text(relative, encoding)
        return path, text.splitlines()

    def iterate_lines(self, relative: str, encoding: str) -> tuple[Path, list[str]]:
        """SentEval's ``for line in io.open(...)`` (universal newlines; line ends kept)."""
        path, text = self.text(relative, encoding)
        return path, list(io.StringIO(text, newline=None))


def _sentevals_order(keys: Sequence[tuple]) -> list[int]:
    """The order of ``sorted(zip(...), key=...)`` in SentEval (a stable sort on the keys)."""
    return sorted(range(len(keys)), key=keys.__getitem__)


def _float(value: str, path: Path, line: int) -> float:
    try:
        return float(value)
    except ValueError:
        raise DataFormatError(f"{path}:{line}: score {value!r} is not a number") from None


def _fields(line: str, path: Path, number: int, minimum: int, what: str) -> list[str]:
    fields = line.strip().split("\t")
    if len(fields) < minimum:
        raise DataFormatError(
            f"{path}:{number}: expected at least {minimum} tab-separated fields ({what}), "
            f"found {len(fields)}"
        )
    return fields


def _load_sts_year(downstream: Path, task: str) -> StsTask:
    reader = _Reader(downstream, task)
    folder = f"STS/{task}-en-test"
    parts = []
    for name in STS_YEARS[task]:
        input_path, inputs = reader.read_splitlines(f"{folder}/STS.input.{name}.txt", "utf-8")
        gold_path, gold = reader.read_splitlines(f"{folder}/STS.gs.{name}.txt", "utf-8")
        if len(gold) != len(inputs):
            raise DataFormatError(
                f"{gold_path}: {len(gold)} lines but {input_path} has {len(inputs)} "
                "(one score or empty line per sentence pair expected)"
            )
        sent1, sent2, scores = [], [], []
        for number, (line, score) in enumerate(zip(inputs, gold, strict=True), start=1):
            fields = line.split("\t")
            if len(fields) != 2:
                raise DataFormatError(
                    f"{input_path}:{number}: expected 2 tab-separated sentences, "
                    f"found {len(fields)} fields"
                )
            if score == "":  # an unscored pair: SentEval drops it
                continue
            scores.append(_float(score, gold_path, number))
            sent1.append(join_tokens(fields[0]))
            sent2.append(join_tokens(fields[1]))
        parts.append(StsPairs(name, sent1, sent2, np.array(scores, dtype=np.float64)))
    return StsTask(task, tuple(parts), tuple(reader.files))


def _load_scored_pairs(
    reader: _Reader, relative: str, columns: tuple[int, int, int], skip_header: bool, name: str
) -> StsPairs:
    path, lines = reader.iterate_lines(relative, "utf-8")
    score_col, a_col, b_col = columns
    sent1, sent2, scores = [], [], []
    for number, line in enumerate(lines, start=1):
        if skip_header and number == 1:
            continue
        fields = _fields(line, path, number, max(columns) + 1, "score and sentence pair")
        scores.append(_float(fields[score_col], path, number))
        sent1.append(join_tokens(fields[a_col]))
        sent2.append(join_tokens(fields[b_col]))
    return StsPairs(name, sent1, sent2, np.array(scores, dtype=np.float64))


# SentEval scores train, dev and test of STS-B and SICK-R; SimCSE reports the test Spearman. We
# score dev and test (dev is STS-B's model-selection split and feeds alignment/uniformity).
def _load_stsb(downstream: Path, splits: tuple[str, ...] = ("dev", "test")) -> StsTask:
    reader = _Reader(downstream, "STSBenchmark")
    parts = tuple(
        _load_scored_pairs(reader, f"STS/STSBenchmark/sts-{split}.csv", (4, 5, 6), False, split)
        for split in splits
    )
    return StsTask("STSBenchmark", parts, tuple(reader.files))


def load_stsb_dev(downstream: Path) -> StsPairs:
    """STS-B dev alone (a trainer selecting checkpoints needs no test file)."""
    return _load_stsb(downstream, ("dev",)).parts[0]


def _load_sickr(downstream: Path) -> StsTask:
    reader = _Reader(downstream, "SICKRelatedness")
    files = {"dev": "SICK/SICK_trial.txt", "test": "SICK/SICK_test_annotated.txt"}
    parts = tuple(
        _load_scored_pairs(reader, relative, (3, 1, 2), True, split)
        for split, relative in files.items()
    )
    return StsTask("SICKRelatedness", parts, tuple(reader.files))


def _split(columns: list[list[list[str]]], labels: list[int], key) -> LabelledSplit:
    """Texts and labels reordered by ``key(tokens..., label)`` as SentEval sorts them."""
    order = _sentevals_order(
        [key(*(col[i] for col in columns), labels[i]) for i in range(len(labels))]
    )
    joined = tuple([" ".join(col[i]) for i in order] for col in columns)
    return LabelledSplit(joined, np.array([labels[i] for i in order], dtype=np.int64))


def _by_length_then_label(tokens: list[str], label: int) -> tuple[int, int]:
    return (len(tokens), label)


def _load_binary(downstream: Path, task: str) -> TransferTask:
    reader = _Reader(downstream, task)
    tokens: list[list[str]] = []
    labels: list[int] = []
    for relative, label in zip(BINARY_FILES[task], (1, 0), strict=True):
        _, lines = reader.read_splitlines(relative, "latin-1")
        tokens += [line.split() for line in lines]
        labels += [label] * len(lines)
    split = _split([tokens], labels, _by_length_then_label)
    return TransferTask(task, 2, {"all": split}, tuple(reader.files))


def _load_sst2(downstream: Path) -> TransferTask:
    reader = _Reader(downstream, "SST2")
    splits = {}
    for split in ("train", "dev", "test"):
        path, lines = reader.iterate_lines(f"SST/binary/sentiment-{split}", "utf-8")
        tokens, labels = [], []
        for number, line in enumerate(lines, start=1):
            fields = _fields(line, path, number, 2, "sentence and label")
            if fields[1] not in ("0", "1"):
                raise DataFormatError(f"{path}:{number}: label {fields[1]!r} is not 0 or 1")
            tokens.append(fields[0].split())
            labels.append(int(fields[1]))
        splits[split] = _split([tokens], labels, _by_length_then_label)
    return TransferTask("SST2", 2, splits, tuple(reader.files))


def _load_trec(downstream: Path) -> TransferTask:
    reader = _Reader(downstream, "TREC")
    splits = {}
    for split, relative in (("train", "TREC/train_5500.label"), ("test", "TREC/TREC_10.label")):
        path, lines = reader.iterate_lines(relative, "latin-1")
        tokens, labels = [], []
        for number, line in enumerate(lines, start=1):
            target, colon, rest = line.strip().partition(":")
            _, space, question = rest.partition(" ")
            if not colon or not space or target not in TREC_LABELS:
                raise DataFormatError(
                    f"{path}:{number}: expected 'COARSE:fine question' with COARSE in "
                    f"{', '.join(TREC_LABELS)}"
                )
            tokens.append(question.split())
            labels.append(TREC_LABELS[target])
        splits[split] = _split([tokens], labels, _by_length_then_label)
    return TransferTask("TREC", len(TREC_LABELS), splits, tuple(reader.files))


def _load_mrpc(downstream: Path) -> TransferTask:
    reader = _Reader(downstream, "MRPC")
    splits = {}
    for split in ("train", "test"):
        path, lines = reader.iterate_lines(f"MRPC/msr_paraphrase_{split}.txt", "utf-8")
        a, b, labels = [], [], []
        for number, line in enumerate(lines[1:], start=2):  # the first line is a header
            fields = _fields(line, path, number, 5, "quality, two ids, two sentences")
            if fields[0] not in ("0", "1"):
                raise DataFormatError(f"{path}:{number}: quality {fields[0]!r} is not 0 or 1")
            a.append(fields[3].split())
            b.append(fields[4].split())
            labels.append(int(fields[0]))
        splits[split] = _split([a, b], labels, lambda ta, tb, label: (len(ta), len(tb), label))
    return TransferTask("MRPC", 2, splits, tuple(reader.files))
