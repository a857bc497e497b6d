"""Bad model directories end in one line on stderr and exit code 2, never a traceback: no config,
no or corrupt weights, weights of another shape than the config says, a tokenizer that is not the
model's (more tokens than the embedding, none of the model's special token ids), for the verifier
and for a model drafter. Also: a text model whose config AutoModelForCausalLM does not map loads
through the class its config names."""

from __future__ import annotations

import json
import shutil

import pytest
import tiny_models
from fixtures import SPECIALS, build_tokenizer, run_cli, save, tiny_llama

from polyspec.errors import UserError
from polyspec.models import LoadedModel


@pytest.fixture(scope="module")
def good(tmp_path_factory, tokenizer):
    return save(tiny_llama(seed=1), tokenizer, tmp_path_factory.mktemp("good"))


def word_tokenizer(words: int):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate([*SPECIALS, *(f"w{i}" for i in range(words))])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )


def copy_of(good, tmp_path, name="model"):
    path = tmp_path / name
    shutil.copytree(good, path)
    return path


def edit_config(path, **changes):
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


def refused(verifier, drafter="none") -> str:
    code, out, err = run_cli("generate", "--verifier", str(verifier), "--drafter", drafter,
        "--prompt", "w5 w6 w7", "--max-new-tokens", "4", "--dtype", "float32",
    )  # fmt: skip
    lines = err.strip().splitlines()
    assert code == 2 and out == "", (code, out, err)
    assert len(lines) == 1 and lines[0].startswith("polyspec: error: "), err
    assert "Traceback" not in err
    return lines[0]


def test_missing_config(good, tmp_path):
    path = copy_of(good, tmp_path)
    (path / "config.json").unlink()
    assert "has no config.json" in refused(path)


def test_config_that_does_not_parse(good, tmp_path):
    path = copy_of(good, tmp_path)
    (path / "config.json").write_text("{not json")
    assert "not a valid JSON file" in refused(path)


def test_missing_and_corrupt_weights(good, tmp_path):
    path = copy_of(good, tmp_path)
    weights = list(path.glob("*.safetensors"))
    for file in weights:
        file.write_bytes(b"not a safetensors file")
    assert "cannot load model" in refused(path)
    for file in weights:
        file.unlink()
    assert "model.safetensors" in refused(path)


@pytest.mark.parametrize("change", [{"hidden_size": 64}, {"vocab_size": 32}], ids=["hidden", "vocab"])
def test_weights_of_another_shape(good, tmp_path, change):
    path = copy_of(good, tmp_path)
    edit_config(path, **change)
    line = refused(path)
    assert "do not fit its config.json" in line and "the config makes it" in line


def test_drafter_with_weights_of_another_shape(good, tmp_path):
    draft = copy_of(good, tmp_path, "draft")
    edit_config(draft, hidden_size=64)
    assert "do not fit its config.json" in refused(good, f"model:{draft}")


def test_tokenizer_with_more_tokens_than_the_model(good, tmp_path):
    path = copy_of(good, tmp_path)
    word_tokenizer(200).save_pretrained(path)
    assert "204 tokens but the model's embedding only 64 rows" in refused(path)


def test_tokenizer_without_the_models_special_tokens(tmp_path):
    """A model with a 128-row embedding whose end-of-sequence token is id 100, shipped with a
    64-token tokenizer: id 100 is no token of it."""
    model = tiny_models.tiny_model("llama", overrides={"vocab_size": 128, "eos_token_id": 100})
    path = save(model, build_tokenizer(), tmp_path / "model")
    line = refused(path)
    assert "names token 100 as its eos token" in line and "64 tokens" in line
    with pytest.raises(UserError, match="not this model's tokenizer"):
        LoadedModel.load(str(path), dtype="float32")


def test_text_config_that_auto_class_does_not_map_loads_by_its_class(tmp_path, tokenizer):
    """Emu3's text model: AutoModelForCausalLM maps the multimodal config only."""
    model = tiny_models.tiny_model("emu3")
    path = save(model, tokenizer, tmp_path / "emu3")
    loaded = LoadedModel.load(str(path), dtype="float32")
    assert type(loaded.model) is type(model)
