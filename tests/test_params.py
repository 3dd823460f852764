"""params.yaml validation: every bad input stops with one message naming the key path."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from stages.core.schema.bounds import bounds_markdown
from stages.core.schema.params import ParamsError, load_params, parse_params

REPO = Path(__file__).resolve().parents[1]
DEFAULT = yaml.safe_load((REPO / "params.yaml").read_text())


def edited(edit: Any) -> dict[str, Any]:
    raw = copy.deepcopy(DEFAULT)
    edit(raw)
    return raw


def set_key(path: str, value: Any):
    def edit(raw: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = raw
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        node[last] = value

    return edit


# (case, edit, fragments the message must contain)
BAD_PARAMS = [
    ("unknown section", set_key("trian", {}), ["trian: unknown key", "allowed keys: data"]),
    ("unknown train key", set_key("train.lr", 1e-5), ["train.lr: unknown key", "learning_rate"]),
    (
        "unknown objective",
        set_key("methods.simcse.objective", {"name": "nce"}),
        ["methods.simcse.objective", "'nce'", "'infonce'"],
    ),
    (
        "unknown objective key",
        set_key("methods.simcse.objective.margin", 1),
        ["methods.simcse.objective.margin: unknown key", "allowed keys: name, tau"],
    ),
    (
        "unknown pooler",
        set_key("train.pooler", "avg"),
        ["train.pooler", "'cls', 'cls_before_pooler', 'mean' or 'first_last_mean'", "'avg'"],
    ),
    ("tau zero", set_key("methods.simcse.objective.tau", 0), ["objective.tau", "greater than 0"]),
    ("tau negative", set_key("methods.simcse.objective.tau", -0.05), ["greater than 0", "-0.05"]),
    ("masking rate 1", set_key("triplets.long_mask_rate", 1.0), ["long_mask_rate", "less than 1"]),
    (
        "masking rate 0",
        set_key("triplets.short_mask_rate", 0),
        ["short_mask_rate", "greater than 0"],
    ),
    (
        "masking rates not nested",
        set_key("triplets.long_mask_rate", 0.1),
        ["triplets", "long_mask_rate (0.1) must exceed short_mask_rate (0.2)"],
    ),
    (
        "wrong type",
        set_key("train.batch_size", "sixty-four"),
        ["train.batch_size", "valid integer", "'sixty-four'"],
    ),
    ("negative learning rate", set_key("train.learning_rate", -3e-5), ["train.learning_rate"]),
    (
        "repeated seed",
        set_key(
            "experiments", [{"methods": ["simcse"], "backbones": ["bert-base"], "seeds": [1, 2, 1]}]
        ),
        ["experiments.0.seeds", "1 listed more than once"],
    ),
    (
        "length beyond 512",
        set_key("train.max_seq_length", 1024),
        ["train.max_seq_length", "less than or equal to 512", "1024"],
    ),
    ("dropout of 1", set_key("train.dropout", 1.0), ["train.dropout", "less than 1"]),
    (
        "unknown method in matrix",
        set_key("experiments.0.methods", ["simcse", "arcse"]),
        ["experiments.0.methods: unknown name 'arcse'", "defined: arccse, simace, simcse"],
    ),
    (
        "unknown backbone in matrix",
        set_key("experiments.0.backbones", ["bert-large"]),
        ["experiments.0.backbones: unknown name 'bert-large'", "defined: bert-base"],
    ),
    (
        "unknown backbone in baseline",
        set_key("baselines.bert-base-first-last.backbone", "roberta-base"),
        ["baselines.bert-base-first-last.backbone: unknown name 'roberta-base'"],
    ),
    (
        "baseline on a randomly initialised backbone",
        set_key("backbones.bert-base.random_init", {"hidden_size": 32}),
        ["baselines.bert-base-first-last.backbone: 'bert-base' is randomly initialised"],
    ),
    (
        "unknown key in a method's train override",
        set_key("methods.simcse.train", {"learning_rat": 1e-5}),
        ["methods.simcse.train.learning_rat: unknown key", "learning_rate"],
    ),
    (
        "bad value in a per-backbone override",
        set_key("methods.simcse.per_backbone", {"bert-base": {"objective": {"tau": -1}}}),
        ["methods.simcse.per_backbone.bert-base.objective.tau", "greater than 0"],
    ),
    (
        "per-backbone override of an unknown backbone",
        set_key("methods.simcse.per_backbone", {"bert-huge": {"train": {"batch_size": 32}}}),
        ["methods.simcse.per_backbone: unknown name 'bert-huge'"],
    ),
    (
        "cool-down without its parameters",
        set_key("methods.simcse.temperature", {"schedule": "tcc"}),
        ["methods.simcse.temperature", "needs both initial_tau", "step_ratio"],
    ),
    (
        "unknown schedule",
        set_key("methods.simcse.temperature", {"schedule": "cyclic"}),
        ["methods.simcse.temperature.schedule", "'constant', 'tcc', 'tcs' or 'linear'"],
    ),
    (
        "schedule on align_mhe whose loss has no tau with softmax_weight off",
        set_key(
            "methods.simcse",
            {
                "objective": {"name": "align_mhe"},
                "temperature": {"schedule": "tcc", "initial_tau": 0.1, "step_ratio": 0.5},
            },
        ),
        ["methods.simcse", "align_mhe' has no temperature to schedule in this configuration"],
    ),
    (
        "schedule on vicreg in a per-backbone override turning softmax_weight off",
        set_key(
            "methods.simcse",
            {
                "objective": {"name": "vicreg", "softmax_weight": True},
                "temperature": {"schedule": "tcs", "initial_tau": 0.1, "step_ratio": 0.5},
                "per_backbone": {"bert-base": {"objective": {"softmax_weight": False}}},
            },
        ),
        ["methods.simcse.per_backbone.bert-base", "'vicreg' has no temperature to schedule"],
    ),
    (
        "tau given where barlow_twins does not read it",
        set_key("methods.simcse.objective", {"name": "barlow_twins", "tau": 0.1}),
        ["methods.simcse", "objective.tau: objective 'barlow_twins' does not read it"],
    ),
    (
        "ratio and margin given without their switches",
        set_key("methods.simcse.objective", {"name": "align_mhs", "ratio": 1.2, "margin": 0.3}),
        ["methods.simcse", "objective.margin, objective.ratio: objective 'align_mhs'"],
    ),
    (
        "nu given where the softmax weight replaces it",
        set_key(
            "methods.simcse.objective",
            {
                "name": "align_mhe",
                "softmax_weight": True,
                "uniformity_weight": 5,
            },
        ),
        ["objective.uniformity_weight: objective 'align_mhe' does not read it"],
    ),
    (
        "triplet dropout on an objective without triplets",
        set_key("methods.simcse.train", {"triplet_dropout": True}),
        ["methods.simcse.train.triplet_dropout: objective 'infonce' has no triplet branch"],
    ),
    (
        "in-batch triplets on an objective without triplets",
        set_key("methods.simcse.train", {"triplet_batching": "batch"}),
        ["methods.simcse.train.triplet_batching: objective 'infonce' has no triplet branch"],
    ),
    (
        "a triplet batch size where the batch's sentences decide",
        set_key("methods.arccse.train", {"triplet_batching": "batch", "triplet_batch_size": 32}),
        ["methods.arccse", "train.triplet_batch_size: with triplet_batching: batch"],
    ),
    (
        "unknown SentEval task",
        set_key("evaluations.senteval.tasks", ["STS12", "STS17"]),
        ["evaluations.senteval.tasks.1", "'STS17'", "'STS12'"],
    ),
    (
        "no SentEval task",
        set_key("evaluations.senteval.tasks", []),
        ["evaluations.senteval.tasks", "at least 1 item"],
    ),
    (
        "unknown SentEval mode",
        set_key("evaluations.senteval.mode", "fast"),
        ["evaluations.senteval.mode", "'fasttest'"],
    ),
    (
        "a section of the old layout",
        set_key("senteval", {"mode": "fasttest"}),
        ["senteval: moved to evaluations.senteval"],
    ),
    (
        "a method's override of the old layout",
        set_key("methods.simcse.mteb", {"enabled": False}),
        ["methods.simcse.mteb: moved to methods.simcse.evaluations.mteb"],
    ),
    (
        "per-method settings of an evaluation that takes none",
        set_key("methods.simcse.evaluations", {"senteval": {"mode": "fasttest"}}),
        ["methods.simcse.evaluations.senteval: senteval takes no per-method settings"],
    ),
    (
        "a bad per-method setting of an evaluation",
        set_key("methods.simcse.evaluations", {"mteb": {"tasks": "sts9"}}),
        ["methods.simcse.evaluations.mteb.tasks", "unknown task set 'sts9'"],
    ),
    ("unknown data source", set_key("data.source", "s3"), ["data.source", "'remote' or 'local'"]),
    (
        "method name unsafe for paths",
        set_key("methods.SimCSE v2", copy.deepcopy(DEFAULT["methods"]["simcse"])),
        ["methods.SimCSE v2", "should match pattern"],
    ),
    ("empty matrix", set_key("experiments", []), ["experiments", "at least 1 item"]),
    ("empty seeds", set_key("experiments.0.seeds", []), ["experiments.0.seeds", "at least 1"]),
    ("backbone without model", set_key("backbones.bert-base", {}), ["backbones.bert-base.model"]),
    (
        "method key unsafe for paths",
        set_key("methods.simcse.method_key", "SimCSE"),
        ["methods.simcse.method_key", "should match pattern"],
    ),
    (
        "sweep not name=value",
        set_key("methods.simcse.sweep", "tau 0.07"),
        ["methods.simcse.sweep", "should match pattern"],
    ),
    (
        "heads do not divide the hidden size",
        set_key("backbones.bert-base.random_init", {"hidden_size": 32, "num_attention_heads": 3}),
        [
            "backbones.bert-base.random_init: hidden_size (32) must be a multiple of "
            "num_attention_heads (3)"
        ],
    ),
    (
        "a batch of one sentence",
        set_key("train.batch_size", 1),
        ["train.batch_size: must be at least 2 (got 1): each sentence's in-batch negatives"],
    ),
    (
        "a method's batch of one sentence",
        set_key("methods.simcse.train", {"batch_size": 1}),
        ["methods.simcse.train.batch_size: must be at least 2 (got 1)"],
    ),
    (
        "a boolean batch size",
        set_key("train.batch_size", True),
        ["train.batch_size: Input should be a valid integer (got True)"],
    ),
    (
        "a boolean step count",
        set_key("train.max_steps", True),
        ["train.max_steps: Input should be a valid integer (got True)"],
    ),
    (
        "a boolean seed",
        set_key("experiments.0.seeds", [True]),
        ["experiments.0.seeds.0: Input should be a valid integer (got True)"],
    ),
    (
        "a misspelled report baseline",
        set_key("report.baseline_method", "simcsee"),
        ["report.baseline_method: unknown name 'simcsee'; defined: arccse, simace, simcse"],
    ),
    (
        "a store URL of an unsupported scheme",
        set_key("store.url", "ftp://x"),
        ["store.url: unsupported scheme 'ftp://'; use a path or one of file://, s3://"],
    ),
    (
        "a compiled forward with cached steps",
        lambda raw: raw["train"].update({"compile": True, "embedding_chunk_size": 8}),
        ["embedding_chunk_size encodes each chunk twice", "set compile: false with it"],
    ),
    (
        "an unknown compile mode",
        set_key("train.compile", "max-autotune"),
        ["train.compile", "'auto', False, True or 'reduce-overhead'", "'max-autotune'"],
    ),
    (
        "readings not a list of strings",
        set_key("methods.simcse.readings", [{"tau": "0.05"}]),
        ["methods.simcse.readings.0", "valid string"],
    ),
]


@pytest.mark.parametrize(
    ("edit", "fragments"), [c[1:] for c in BAD_PARAMS], ids=[c[0] for c in BAD_PARAMS]
)
def test_bad_params_are_rejected_with_the_key_path(edit: Any, fragments: list[str]) -> None:
    with pytest.raises(ParamsError) as err:
        parse_params(edited(edit))
    message = str(err.value)
    assert message.startswith("params.yaml is invalid:")
    for fragment in fragments:
        assert fragment in message


def test_a_schedule_on_a_softmax_weighted_paradigm_objective_is_accepted() -> None:
    edit = set_key("methods.simcse", {
        "objective": {"name": "barlow_twins", "softmax_weight": True, "tau": 0.05},
        "temperature": {"schedule": "tcc", "initial_tau": 0.1, "step_ratio": 0.5},
    })  # fmt: skip
    method = parse_params(edited(edit)).resolve("simcse", None)
    assert method.objective.uses_temperature and method.objective.tau == 0.05


def test_every_problem_is_reported_at_once() -> None:
    def several(raw: dict[str, Any]) -> None:
        raw["train"]["pooler"] = "avg"
        raw["evaluations"]["senteval"]["mode"] = "fast"
        raw["methods"]["simcse"]["objective"]["tau"] = 0

    with pytest.raises(ParamsError) as err:
        parse_params(edited(several))
    assert str(err.value).count("\n  - ") == 3


@pytest.mark.parametrize("unpad", [True, False])
def test_cuda_graphs_are_accepted_with_either_forward(unpad: bool) -> None:
    def cuda_graphs(raw: dict[str, Any]) -> None:
        raw["train"].update({"compile": "reduce-overhead", "unpad": unpad})

    assert parse_params(edited(cuda_graphs)).train.compile == "reduce-overhead"


def test_compile_auto_is_the_default_and_stays_with_cached_steps() -> None:
    def chunked(raw: dict[str, Any]) -> None:
        raw["train"].pop("compile")
        raw["train"]["embedding_chunk_size"] = 8

    assert parse_params(edited(chunked)).train.compile == "auto"


def test_default_params_are_valid() -> None:
    params = load_params(REPO / "params.yaml")
    assert params.resolve("simcse", "bert-base").train.learning_rate == pytest.approx(3e-5)


def test_overrides_apply_per_method_then_per_backbone() -> None:
    def overrides(raw: dict[str, Any]) -> None:
        raw["methods"]["simcse"]["train"] = {"learning_rate": 1e-5, "batch_size": 128}
        raw["methods"]["simcse"]["per_backbone"] = {
            "bert-base": {"train": {"batch_size": 256}, "objective": {"tau": 0.07}}
        }

    params = parse_params(edited(overrides))
    resolved = params.resolve("simcse", "bert-base")
    assert resolved.train.learning_rate == pytest.approx(1e-5)
    assert resolved.train.batch_size == 256
    assert resolved.objective.tau == pytest.approx(0.07)
    assert params.resolve("simcse", None).train.batch_size == 128


def test_unreadable_files_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ParamsError, match="no such params file"):
        load_params(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("train: [unclosed\n")
    with pytest.raises(ParamsError, match=r"broken.yaml: not valid YAML"):
        load_params(broken)
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("report: {baseline_method: simcsé}\n".encode("latin-1"))
    with pytest.raises(ParamsError, match=r"latin1.yaml: not UTF-8 text \(byte 0xe9 at offset"):
        load_params(latin1)
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n")
    with pytest.raises(ParamsError, match="expected a mapping of sections"):
        load_params(listing)


def test_entry_points_stop_before_any_work(tmp_path: Path) -> None:
    """A stage CLI with bad params prints one clean message, exits 2 and writes nothing."""
    bad = tmp_path / "params.yaml"
    bad.write_text(yaml.safe_dump(edited(set_key("methods.simcse.objective.tau", -1))))
    result = subprocess.run(
        [sys.executable, "-m", "stages.commands", "dvc", "--params", str(bad)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert "methods.simcse.objective.tau: Input should be greater than 0" in result.stderr
    assert "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


def test_published_key_sweep_and_readings_are_optional_and_kept() -> None:
    def sweep_point(raw: dict[str, Any]) -> None:
        raw["methods"]["simcse-tau-0_07"] = {
            "objective": {"name": "infonce", "tau": 0.07},
            "method_key": "simcse",
            "sweep": "tau=0.07",
            "readings": ["tau grid unclear -> 0.07 (spec B.7)"],
        }

    params = parse_params(edited(sweep_point))
    assert params.method_key("simcse") == "simcse"  # no key given: the method's own name
    assert params.method_key("simcse-tau-0_07") == "simcse"
    assert params.methods["simcse-tau-0_07"].sweep == "tau=0.07"
    assert params.methods["simcse-tau-0_07"].readings == ("tau grid unclear -> 0.07 (spec B.7)",)
    assert params.methods["simcse"].readings == ()


def test_the_docs_show_the_bounds_table_as_it_is() -> None:
    """docs/training.md's table of ranges is BOUNDS (stages/core/schema/bounds.py) rendered."""
    text = (REPO / "docs/training.md").read_text(encoding="utf-8")
    begin = "<!-- bounds: generated from stages/core/schema/bounds.py -->\n"
    shown = text.split(begin, 1)[1].split("<!-- end of bounds -->", 1)[0]
    assert shown == bounds_markdown(), "regenerate it from bounds_markdown()"
