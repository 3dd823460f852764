"""SentEval's file formats, sample order and quirks, and clear errors on bad files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stages.core.schema.evaluation_settings import SENTEVAL_TASKS
from stages.senteval_protocol.loaders import (
    TASK_FOLDERS,
    DataFormatError,
    StsTask,
    TransferTask,
    downstream_dir,
    load_task,
)


def _write(path: Path, text: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())


def test_every_registered_task_has_a_folder_and_loads_from_the_synthetic_tree(
    senteval_root: Path,
) -> None:
    # the registry (stages.core.schema.evaluation_settings) names the tasks; the loaders must read
    # each of them
    assert set(TASK_FOLDERS) == set(SENTEVAL_TASKS)
    down = downstream_dir(senteval_root)
    for name in SENTEVAL_TASKS:
        task = load_task(down, name)
        assert task.name == name
        assert task.files and all(len(f.sha256) == 64 for f in task.files)
        assert all(f.path.startswith(TASK_FOLDERS[name] + "/") for f in task.files)


def test_sts_drops_unscored_pairs_and_joins_whitespace_tokens(tmp_path: Path) -> None:
    folder = tmp_path / "downstream" / "STS" / "STS13-en-test"
    for name in ("FNWN", "headlines", "OnWN"):
        _write(folder / f"STS.input.{name}.txt", "a  b\tc d\ne\tf\n g h \ti\n")
        _write(folder / f"STS.gs.{name}.txt", "4.5\n\n0.25\n")
    task = load_task(downstream_dir(tmp_path), "STS13")
    assert isinstance(task, StsTask)
    fnwn = task.parts[0]
    assert [p.name for p in task.parts] == ["FNWN", "headlines", "OnWN"]
    assert fnwn.sent1 == ["a b", "g h"] and fnwn.sent2 == ["c d", "i"]
    np.testing.assert_array_equal(fnwn.scores, [4.5, 0.25])


def test_sts_malformed_line_names_file_and_line(tmp_path: Path) -> None:
    folder = tmp_path / "downstream" / "STS" / "STS13-en-test"
    _write(folder / "STS.input.FNWN.txt", "a\tb\nno tab here\n")
    _write(folder / "STS.gs.FNWN.txt", "1\n2\n")
    with pytest.raises(DataFormatError, match=r"STS\.input\.FNWN\.txt:2: expected 2 tab"):
        load_task(downstream_dir(tmp_path), "STS13")


def test_sts_bad_score_and_length_mismatch(tmp_path: Path) -> None:
    folder = tmp_path / "downstream" / "STS" / "STS13-en-test"
    _write(folder / "STS.input.FNWN.txt", "a\tb\nc\td\n")
    _write(folder / "STS.gs.FNWN.txt", "1\nfive\n")
    with pytest.raises(DataFormatError, match=r"STS\.gs\.FNWN\.txt:2: score 'five'"):
        load_task(downstream_dir(tmp_path), "STS13")
    _write(folder / "STS.gs.FNWN.txt", "1\n")
    with pytest.raises(DataFormatError, match=r"1 lines but .* has 2"):
        load_task(downstream_dir(tmp_path), "STS13")


def test_missing_files_and_roots_are_named(tmp_path: Path) -> None:
    with pytest.raises(DataFormatError, match="no downstream/ folder"):
        downstream_dir(tmp_path)
    (tmp_path / "downstream").mkdir()
    with pytest.raises(DataFormatError, match=r"MR/rt-polarity\.pos: missing \(needed by MR\)"):
        load_task(downstream_dir(tmp_path), "MR")


def test_binary_task_is_latin1_and_in_sentevals_length_then_label_order(tmp_path: Path) -> None:
    down = tmp_path / "downstream"
    _write(down / "MR/rt-polarity.pos", b"one two three\ncaf\xe9\nx y\n")
    _write(down / "MR/rt-polarity.neg", b"p q\nr\n\n")
    task = load_task(downstream_dir(tmp_path), "MR")
    assert isinstance(task, TransferTask)
    split = task.splits["all"]
    # key (number of tokens, label), ties kept in file order (pos before neg)
    assert split.columns[0] == ["", "r", "caf\xe9", "p q", "x y", "one two three"]
    assert split.labels.tolist() == [0, 0, 1, 0, 1, 1]


def test_trec_sst_and_mrpc_formats(tmp_path: Path) -> None:
    down = tmp_path / "downstream"
    _write(down / "TREC/train_5500.label", "NUM:date When did it end ?\nHUM:ind Who ?\n")
    _write(down / "TREC/TREC_10.label", "LOC:city Where is it ?\n")
    trec = load_task(downstream_dir(tmp_path), "TREC")
    assert trec.splits["train"].columns[0] == ["Who ?", "When did it end ?"]
    assert trec.splits["train"].labels.tolist() == [3, 5]

    for split in ("train", "dev", "test"):
        _write(down / f"SST/binary/sentiment-{split}", "a fine film . \t1\nbad \t0\n")
    sst = load_task(downstream_dir(tmp_path), "SST2")
    assert sst.splits["dev"].columns[0] == ["bad", "a fine film ."]

    header = "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
    _write(
        down / "MRPC/msr_paraphrase_train.txt", header + "1\t1\t2\tx y z\tx y\n0\t3\t4\tq\tr s\n"
    )
    _write(down / "MRPC/msr_paraphrase_test.txt", header + "1\t5\t6\tu\tv\n")
    mrpc = load_task(downstream_dir(tmp_path), "MRPC")
    train = mrpc.splits["train"]
    assert train.columns == (["q", "x y z"], ["r s", "x y"])  # sorted by (len A, len B, label)
    assert train.labels.tolist() == [0, 1]


def test_bad_lines_in_transfer_files_are_named(tmp_path: Path) -> None:
    down = tmp_path / "downstream"
    _write(down / "TREC/train_5500.label", "NUM:date When ?\nWHAT:x y\n")
    _write(down / "TREC/TREC_10.label", "LOC:city Where ?\n")
    with pytest.raises(DataFormatError, match=r"train_5500\.label:2: expected 'COARSE:fine"):
        load_task(downstream_dir(tmp_path), "TREC")
    header = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
    _write(down / "MRPC/msr_paraphrase_train.txt", header + "1\t1\t2\tonly four fields\n")
    with pytest.raises(DataFormatError, match=r"msr_paraphrase_train\.txt:2: expected at least 5"):
        load_task(downstream_dir(tmp_path), "MRPC")
    _write(down / "SST/binary/sentiment-train", "good\t2\n")
    with pytest.raises(DataFormatError, match=r"sentiment-train:1: label '2'"):
        load_task(downstream_dir(tmp_path), "SST2")
    _write(down / "SICK/SICK_trial.txt", b"header\n1\ta\tb\t3.5\n2\ta\t\xff\t1\n")
    with pytest.raises(DataFormatError, match=r"SICK_trial\.txt:3: not valid utf-8"):
        load_task(downstream_dir(tmp_path), "SICKRelatedness")


def test_stsb_and_sickr_read_dev_and_test_columns(tmp_path: Path) -> None:
    down = tmp_path / "downstream"
    for split in ("dev", "test"):
        _write(down / f"STS/STSBenchmark/sts-{split}.csv", "g\tf\ty\t1\t3.800\ta  b\tc\n")
        _write(
            down / f"SICK/SICK_{'trial' if split == 'dev' else 'test_annotated'}.txt",
            "pair_ID\tA\tB\tscore\tlabel\n7\tx  y\tz\t4.2\tNEUTRAL\n",
        )
    stsb = load_task(downstream_dir(tmp_path), "STSBenchmark")
    assert [p.name for p in stsb.parts] == ["dev", "test"]
    assert stsb.parts[1].sent1 == ["a b"] and stsb.parts[1].scores.tolist() == [3.8]
    sick = load_task(downstream_dir(tmp_path), "SICKRelatedness")
    assert sick.parts[0].sent1 == ["x y"] and sick.parts[0].scores.tolist() == [4.2]
