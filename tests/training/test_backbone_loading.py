"""A backbone that cannot be loaded is refused naming its params key (or the --model given) and
what is wrong, never with transformers' own traceback (nor trained with a tokenizer that maps
every word to [UNK])."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stages.core.schema.params import BackboneParams
from stages.modeling.backbone import ModelLoadError, load_backbone, load_tokenizer
from stages.modeling.encoder import SentenceEncoder

TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json")


def linked_copy(source: str, folder: Path, *, without: tuple[str, ...] = ()) -> Path:
    """``source``'s files as links in ``folder``, but those named in ``without``."""
    folder.mkdir()
    for path in Path(source).iterdir():
        if path.name not in without:
            (folder / path.name).symlink_to(path)
    return folder


def test_a_missing_folder_is_named_as_missing(tmp_path: Path) -> None:
    spec = BackboneParams(model=str(tmp_path / "nonexistent"))
    with pytest.raises(ModelLoadError, match=r"^backbones\.tiny\.model \(.*nonexistent\): no such"):
        load_tokenizer(spec, "tiny")
    with pytest.raises(ModelLoadError, match="no such folder"):
        load_backbone(spec, dropout=0.1, key="tiny")


def test_an_unreachable_hub_model_is_named() -> None:
    # offline in the tests; pinned to a commit (a branch would stop at `cse pin` first)
    spec = BackboneParams(model="no-such/model-xyz", revision="0" * 40)
    with pytest.raises(ModelLoadError) as err:
        load_tokenizer(spec, "tiny")
    assert str(err.value).startswith(
        "backbones.tiny.model (no-such/model-xyz): cannot load its tokenizer: "
    )


def test_a_folder_without_config_is_not_a_model(minilm_path: str, tmp_path: Path) -> None:
    folder = linked_copy(minilm_path, tmp_path / "m", without=("config.json",))
    expected = f"backbones.tiny.model ({folder}): not a model folder (no config.json in {folder})"
    with pytest.raises(ModelLoadError) as err:
        load_backbone(BackboneParams(model=str(folder)), dropout=0.1, key="tiny")
    assert str(err.value) == expected


def test_a_folder_without_tokenizer_files_is_refused(minilm_path: str, tmp_path: Path) -> None:
    """AutoTokenizer would build a 5-token BertTokenizer: every word [UNK]."""
    folder = linked_copy(minilm_path, tmp_path / "m", without=TOKENIZER_FILES)
    with pytest.raises(ModelLoadError) as err:
        load_tokenizer(BackboneParams(model=str(folder)), "tiny")
    message = str(err.value)
    assert "its tokenizer has no vocabulary (5 special tokens only" in message
    assert (
        f"{folder} lacks the tokenizer files (tokenizer.json, tokenizer_config.json, vocab.txt)"
        in (message)
    )
    assert message.startswith(f"backbones.tiny.model ({folder}): ")


def test_truncated_weights_are_refused_naming_the_model(minilm_path: str, tmp_path: Path) -> None:
    folder = linked_copy(minilm_path, tmp_path / "m", without=("model.safetensors",))
    weights = (Path(minilm_path) / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    with pytest.raises(ModelLoadError, match=r"\): cannot load its weights: .*incomplete"):
        load_backbone(BackboneParams(model=str(folder)), dropout=0.1, key="tiny")
    with pytest.raises(ModelLoadError, match=rf"^{folder}: cannot load its weights: "):
        SentenceEncoder(str(folder), "mean", device="cpu")


def test_weights_that_do_not_fit_config_json_are_refused_naming_the_model(
    minilm_path: str, tmp_path: Path
) -> None:
    """A config.json edited (or copied from another model) so that the weights' shapes differ
    from what it builds: transformers raises a bare RuntimeError after its load report."""
    folder = linked_copy(minilm_path, tmp_path / "m", without=("config.json",))
    config = json.loads((Path(minilm_path) / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "intermediate_size": 1024}))
    expected = r"\): its weights do not fit its config.json \(tensor shapes differ"
    with pytest.raises(ModelLoadError, match=expected):
        load_backbone(BackboneParams(model=str(folder)), dropout=0.1, key="tiny")
    with pytest.raises(ModelLoadError, match=rf"^{folder}: its weights do not fit"):
        SentenceEncoder(str(folder), "mean", device="cpu")


def test_an_encoder_without_tokenizer_files_is_refused(minilm_path: str, tmp_path: Path) -> None:
    folder = linked_copy(minilm_path, tmp_path / "m", without=TOKENIZER_FILES)
    with pytest.raises(ModelLoadError, match=rf"^{folder}: its tokenizer has no vocabulary"):
        SentenceEncoder(str(folder), "mean", device="cpu")


def test_a_half_precision_checkpoint_loads_with_float32_weights(
    tmp_path: Path, minilm_path: str
) -> None:
    """transformers keeps the dtype a checkpoint was saved in; the trainer's master weights and
    the evaluation encoder are float32 (lower precision is autocast's), whatever that dtype."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    folder = tmp_path / "bf16"
    AutoModel.from_pretrained(minilm_path).to(torch.bfloat16).save_pretrained(folder)
    AutoTokenizer.from_pretrained(minilm_path).save_pretrained(folder)
    assert AutoModel.from_pretrained(folder).dtype == torch.bfloat16  # transformers' default
    spec = BackboneParams(model=str(folder))
    assert load_backbone(spec, dropout=0.1).dtype == torch.float32
    tiny = BackboneParams(model=str(folder), random_init={"hidden_size": 32})
    assert load_backbone(tiny, dropout=0.1).dtype == torch.float32
    assert SentenceEncoder(str(folder), "mean", device="cpu").model.dtype == torch.float32


def test_layers_keeps_the_pretrained_first_layers(minilm_path: str) -> None:
    """``layers: 2``: the embeddings and layers 0-1 are the pretrained ones, bit for bit; the
    same encoder a baseline of that backbone evaluates."""
    whole = load_backbone(BackboneParams(model=minilm_path), dropout=0.1)
    cut = load_backbone(BackboneParams(model=minilm_path, layers=2), dropout=0.1)
    assert cut.config.num_hidden_layers == 2 and len(cut.encoder.layer) == 2
    kept = whole.state_dict()
    for name, tensor in cut.state_dict().items():
        assert kept[name].equal(tensor), name
    baseline = SentenceEncoder(minilm_path, "mean", layers=2)
    assert len(baseline.model.encoder.layer) == 2
    assert baseline.model.encoder.layer[1].output.dense.weight.equal(
        whole.encoder.layer[1].output.dense.weight
    )


def test_more_layers_than_the_model_has_are_refused(minilm_path: str) -> None:
    with pytest.raises(ValueError, match=r"^backbones\.m.*: layers 7 exceeds the 6 layers"):
        load_backbone(BackboneParams(model=minilm_path, layers=7), dropout=0.1, key="m")


def test_layers_with_random_init_is_refused() -> None:
    with pytest.raises(ValueError, match="random_init ignores the weights"):
        BackboneParams(model="x", layers=2, random_init={"hidden_size": 32})
