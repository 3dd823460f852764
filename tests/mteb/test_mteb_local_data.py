"""Local copies of MTEB's STS test sets: real files (sizes, first and last pairs, scores, the
statistics mteb records for the hub datasets) and parser behaviour on small synthetic folders."""

from __future__ import annotations

from pathlib import Path

import mteb
import pytest
from mteb_testing import write_stsb

from stages.mteb_protocol.local_data import (
    LocalDataError,
    compare_with_hub_statistics,
    load_local_pairs,
    local_tasks,
)

SIZES = {
    "STS12": 3108,
    "STS13": 1500,
    "STS14": 3750,
    "STS15": 3000,
    "STS16": 1186,
    "STSBenchmark": 1379,
    "SICK-R": 9927,
}


def _load(task: str, source: str, data: Path):
    return load_local_pairs(task, source, data / "sts_raw", data / "senteval")


def _hub_stats(task: str) -> dict:
    return mteb.get_task(task).metadata.descriptive_stats["test"]


@pytest.mark.parametrize("source", ["senteval", "sts_raw"])
def test_sizes_match_mteb_and_scores_are_in_range(shared_data: Path, source: str) -> None:
    for task in local_tasks(source):
        pairs = _load(task, source, shared_data)
        assert len(pairs) == SIZES[task] == _hub_stats(task)["num_samples"], task
        assert len(pairs.sentence1) == len(pairs.sentence2) == len(pairs.score)
        assert all(0.0 <= s <= 5.0 for s in pairs.score)
        assert pairs.revision.startswith(f"local-{source}-")


def test_senteval_copies_have_mtebs_statistics_exactly(shared_data: Path) -> None:
    """MTEB's STS12-16 are SentEval's text and its STS-B is the raw csv: every statistic mteb
    records (pairs, characters, unique texts, min/max lengths, mean score) agrees."""
    for task in ("STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark"):
        check = compare_with_hub_statistics(_load(task, "senteval", shared_data), _hub_stats(task))
        assert check == {"matches_hub_statistics": True, "differences_local_vs_hub": {}}, task


def test_sick_and_raw_semeval_text_differ_from_mtebs_only_in_text(shared_data: Path) -> None:
    sick_pairs = _load("SICK-R", "senteval", shared_data)
    sick = compare_with_hub_statistics(sick_pairs, _hub_stats("SICK-R"))
    assert not sick["matches_hub_statistics"]
    assert set(sick["differences_local_vs_hub"]) == {"text1_characters", "text2_characters"}
    ours, hub = sick["differences_local_vs_hub"]["text1_characters"]
    assert 0 < ours - hub < 0.002 * hub  # SentEval's SICK is tokenised: spaces before , 's .
    for task in ("STS12", "STS13", "STS14", "STS15", "STS16"):
        raw = compare_with_hub_statistics(_load(task, "sts_raw", shared_data), _hub_stats(task))
        differences = raw["differences_local_vs_hub"]
        assert "num_samples" not in differences and "mean_score" not in differences, task
        ours, hub = differences["text1_characters"]
        assert ours < hub, task  # untokenised: no spaces around punctuation


def test_first_and_last_pairs(shared_data: Path) -> None:
    sts12 = _load("STS12", "senteval", shared_data)
    assert (sts12.sentence1[0], sts12.sentence2[0], sts12.score[0]) == (
        "the problem likely will mean corrective changes before the shuttle fleet starts "
        "flying again .",
        "he said the problem needs to be corrected before the space shuttle fleet is cleared "
        "to fly again .",
        4.4,
    )
    assert (sts12.sentence1[-1], sts12.score[-1]) == (
        "he did , but the initiative did not get very far .",
        3.5,
    )
    raw12 = _load("STS12", "sts_raw", shared_data)
    assert raw12.sentence1[0] == (
        "The problem likely will mean corrective changes before the shuttle fleet starts "
        "flying again."
    )
    stsb = _load("STSBenchmark", "senteval", shared_data)
    assert (stsb.sentence1[-1], stsb.sentence2[-1], stsb.score[-1]) == (
        "South Korea declares end to MERS outbreak",
        "North Korea Delegation Meets With South Korean Officials",
        0.0,
    )
    # line 626 has the two trailing source columns; the text keeps its trailing space, as MTEB's
    assert stsb.sentence1[625].endswith("every two hours. ") and stsb.score[625] == 3.0
    sick = _load("SICK-R", "senteval", shared_data)
    assert (sick.sentence1[0], sick.score[0]) == (
        "A group of kids is playing in a yard and an old man is standing in the background",
        4.5,
    )
    # the test file has CRLF line ends
    assert (sick.sentence2[-1], sick.score[-1]) == (
        "The snowboarder is leaping fearlessly over white snow",
        1.0,
    )


def test_unscored_pairs_are_dropped(shared_data: Path) -> None:
    folder = shared_data / "sts_raw" / "STS2016-en-test"
    inputs = sum(
        len(p.read_text(encoding="utf-8").splitlines()) for p in folder.glob("STS2016.input.*")
    )
    assert inputs == 9183  # 4 columns per line: s1, s2, source1, source2
    sts16 = _load("STS16", "sts_raw", shared_data)
    assert len(sts16) == 1186
    assert not any("StackExchange" in s for s in sts16.sentence2)  # no source column leaked


def _write_year(root: Path, gold: list[str], inputs: list[str]) -> Path:
    """A SemEval-format STS16 folder whose every subset has these lines."""
    folder = root / "STS2016-en-test"
    folder.mkdir(parents=True)
    for subset in ("answer-answer", "headlines", "plagiarism", "postediting", "question-question"):
        (folder / f"STS2016.input.{subset}.txt").write_text("\n".join(inputs) + "\n")
        (folder / f"STS2016.gs.{subset}.txt").write_text("\n".join(gold) + "\n")
    return folder


def test_synthetic_year_drops_empty_gold_lines_and_keeps_text_verbatim(tmp_path: Path) -> None:
    _write_year(tmp_path, ["3.2", "", "0"], ["a  b\tc d\tsrc\tsrc", "x\ty", "e\tf  "])
    pairs = load_local_pairs("STS16", "sts_raw", tmp_path, tmp_path / "none")
    assert pairs.sentence1[:2] == ["a  b", "e"] and pairs.sentence2[:2] == ["c d", "f  "]
    assert pairs.score[:2] == [3.2, 0.0] and len(pairs) == 10


@pytest.mark.parametrize(
    ("gold", "inputs", "message"),
    [
        (["1", "2"], ["a\tb"], r"STS2016\.gs\.answer-answer\.txt: 2 lines but .* has 1"),
        (["1"], ["only one sentence"], r"input\.answer-answer\.txt:1: expected at least 2"),
        (["high"], ["a\tb"], r"gs\.answer-answer\.txt:1: score 'high' is not a number"),
        (["5.5"], ["a\tb"], r"gs\.answer-answer\.txt:1: score 5\.5 outside \[0, 5\]"),
    ],
)
def test_malformed_files_name_the_file_and_line(
    tmp_path: Path, gold: list[str], inputs: list[str], message: str
) -> None:
    _write_year(tmp_path, gold, inputs)
    with pytest.raises(LocalDataError, match=message):
        load_local_pairs("STS16", "sts_raw", tmp_path, tmp_path)


def test_absent_folder_means_no_copy_but_a_missing_file_is_an_error(tmp_path: Path) -> None:
    assert load_local_pairs("STS16", "sts_raw", tmp_path, tmp_path) is None
    assert load_local_pairs("SICK-R", "sts_raw", tmp_path, tmp_path) is None  # no raw SICK
    assert load_local_pairs("BIOSSES", "senteval", tmp_path, tmp_path) is None
    folder = _write_year(tmp_path, ["1"], ["a\tb"])
    (folder / "STS2016.gs.plagiarism.txt").unlink()
    with pytest.raises(LocalDataError, match=r"STS2016\.gs\.plagiarism\.txt: missing"):
        load_local_pairs("STS16", "sts_raw", tmp_path, tmp_path)


def test_revision_follows_the_file_contents(tmp_path: Path) -> None:
    write_stsb(tmp_path, n=5)
    first = load_local_pairs("STSBenchmark", "sts_raw", tmp_path, tmp_path)
    assert load_local_pairs("STSBenchmark", "sts_raw", tmp_path, tmp_path).revision == (
        first.revision
    )
    write_stsb(tmp_path, n=5, seed=1)
    assert load_local_pairs("STSBenchmark", "sts_raw", tmp_path, tmp_path).revision != (
        first.revision
    )
