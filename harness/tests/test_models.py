"""Model builders: synthetic transformer, spec models (pi0.5), lerobot import guard."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from harness.models import (
    LerobotUnavailableError,
    ModelError,
    SpecMismatchError,
    SpecModel,
    SyntheticTransformer,
    build_model,
    fill_non_persistent,
    load_spec,
    spec_differences,
    spec_of,
    weight_order,
)
from harness.models.lerobot import lerobot_reason
from harness.scenario import ModelConfig

ROOT = Path(__file__).resolve().parents[2]
PI05 = ROOT / "harness" / "specs" / "pi05.json"
LM_HEADS = (
    "paligemma_with_expert.paligemma.lm_head.weight",
    "paligemma_with_expert.gemma_expert.lm_head.weight",
)


def all_tensors(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]


def non_persistent(module: nn.Module) -> dict[str, torch.Tensor]:
    out = {}
    for prefix, sub in module.named_modules():
        for leaf, t in sub._buffers.items():
            if t is not None and leaf in sub._non_persistent_buffers_set:
                out[f"{prefix}.{leaf}" if prefix else leaf] = t
    return out


@pytest.fixture(scope="module")
def pi05_spec() -> dict:
    return load_spec(PI05)


def synthetic_config(**changes: object) -> ModelConfig:
    fields: dict = dict(
        source="synthetic", layers=3, width=64, heads=4, vocab=100, ffn_mult=2, dtype="bfloat16"
    )
    fields.update(changes)
    return ModelConfig(**fields)


# --------------------------------------------------------------------------- synthetic


def test_synthetic_structure() -> None:
    cfg = synthetic_config()
    info = build_model(cfg)
    model = info.module
    assert isinstance(model, SyntheticTransformer)
    assert info.source == "synthetic" and info.name == cfg.key
    assert model.lm_head.weight is model.embed.weight
    state = model.state_dict(keep_vars=True)
    assert state["lm_head.weight"] is state["embed.weight"]
    assert "inv_freq" not in state and "inv_freq" in non_persistent(model)
    assert model.inv_freq.shape == (64 // 4 // 2,)
    assert all(t.is_meta for _, t in all_tensors(model))
    assert {t.dtype for t in state.values()} == {torch.bfloat16}
    unique = {id(t): t for t in state.values()}
    assert sum(t.numel() for t in unique.values()) == SyntheticTransformer.expected_numel(
        layers=3, width=64, vocab=100, ffn_mult=2
    )
    assert len(unique) == len(state) - 1  # one tied alias
    order = weight_order(model)
    assert order == list(state)
    assert order[0] == "embed.weight" and order[-2:] == ["norm.weight", "lm_head.weight"]
    assert order[1:9] == [
        f"layers.0.{n}.weight"
        for n in ("attn_norm", "q_proj", "k_proj", "v_proj", "o_proj", "mlp_norm", "up_proj", "down_proj")
    ]


def test_synthetic_size_scales_with_config() -> None:
    small = build_model(synthetic_config(dtype="float32")).module
    wide = build_model(synthetic_config(dtype="float32", width=128)).module

    def nbytes(m: nn.Module) -> int:
        return sum(
            t.numel() * t.element_size()
            for t in {id(t): t for t in m.state_dict(keep_vars=True).values()}.values()
        )

    assert nbytes(small) == 4 * SyntheticTransformer.expected_numel(layers=3, width=64, vocab=100, ffn_mult=2)
    assert nbytes(wide) > 3 * nbytes(small)


def test_synthetic_forward_runs_and_is_deterministic() -> None:
    torch.manual_seed(0)
    model = SyntheticTransformer(layers=2, width=32, vocab=50, heads=4, device="cpu")
    assert torch.allclose(model.inv_freq, 1.0 / 10000 ** (torch.arange(0, 8, 2) / 8))
    tokens = torch.randint(0, 50, (2, 7))
    with torch.no_grad():
        first = model(tokens)
        second = model(tokens)
        changed = tokens.clone()
        changed[:, -1] = (changed[:, -1] + 1) % 50
        third = model(changed)
    assert first.shape == (2, 7, 50) and first.dtype == torch.float32
    assert torch.equal(first, second)
    assert torch.allclose(first[:, :-1], third[:, :-1], atol=1e-5)  # causal
    assert not torch.allclose(first[:, -1], third[:, -1])


def test_synthetic_forward_after_loading_weights() -> None:
    torch.manual_seed(0)
    reference = SyntheticTransformer(layers=1, width=32, vocab=40, heads=2, device="cpu")
    meta = SyntheticTransformer(layers=1, width=32, vocab=40, heads=2)
    meta.load_state_dict(reference.state_dict(), assign=True)
    with pytest.raises(RuntimeError, match="fill_non_persistent"):
        meta(torch.zeros(1, 3, dtype=torch.long))
    assert fill_non_persistent(meta) == ["inv_freq"]
    tokens = torch.randint(0, 40, (1, 5))
    with torch.no_grad():
        assert torch.equal(meta(tokens), reference(tokens))


def test_synthetic_rejects_uneven_heads() -> None:
    with pytest.raises(ModelError, match="heads"):
        SyntheticTransformer(layers=1, width=30, vocab=10, heads=4)


# --------------------------------------------------------------------------- spec


def test_pi05_spec_model_reproduces_spec(pi05_spec: dict) -> None:
    model = SpecModel(pi05_spec)
    state = model.state_dict(keep_vars=True)
    assert list(state) == [t["name"] for t in pi05_spec["tensors"]]
    assert len(state) == 813
    for entry in pi05_spec["tensors"]:
        t = state[entry["name"]]
        assert list(t.shape) == entry["shape"], entry["name"]
        assert str(t.dtype) == f"torch.{entry['dtype']}", entry["name"]
        assert isinstance(t, nn.Parameter) == (entry["kind"] == "param")
        assert t.is_meta
    assert sum(t.numel() * t.element_size() for t in state.values()) == 9_353_911_360
    assert all(t.is_meta for _, t in all_tensors(model))
    assert sorted(non_persistent(model)) == sorted(b["name"] for b in pi05_spec["non_persistent_buffers"])
    described = spec_of(model)
    for key in ("numel", "nbytes", "tensors", "tied", "non_persistent_buffers"):
        assert described[key] == pi05_spec[key], key
    assert spec_differences(pi05_spec, described) == []
    assert weight_order(model) == list(state)


def test_pi05_spec_source(pi05_spec: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    info = build_model(ModelConfig(source="spec", spec=PI05))
    assert info.source == "spec:harness/specs/pi05.json"
    assert info.name == "pi05" and isinstance(info.module, SpecModel)
    assert "weights only" in info.source_note


def test_spec_model_forward_raises(pi05_spec: dict) -> None:
    with pytest.raises(TypeError, match="weights only"):
        SpecModel(pi05_spec)(torch.zeros(1))


def test_trim_drops_exactly_the_named(pi05_spec: dict) -> None:
    full = list(SpecModel(pi05_spec).state_dict())
    trimmed = list(build_model(ModelConfig(source="spec", spec=PI05, trim=LM_HEADS)).module.state_dict())
    assert trimmed == [n for n in full if n not in LM_HEADS]
    assert len(full) - len(trimmed) == 2


def test_unknown_trim_name_errors(pi05_spec: dict) -> None:
    with pytest.raises(ModelError, match="no.such.weight"):
        SpecModel(pi05_spec, trim=[LM_HEADS[0], "no.such.weight"])
    with pytest.raises(ModelError, match="no.such.weight"):
        build_model(ModelConfig(source="spec", spec=PI05, trim=("no.such.weight",)))


def tiny_spec() -> dict:
    def entry(name: str, shape: list[int], dtype: str = "float32", kind: str = "param") -> dict:
        return {"name": name, "shape": shape, "dtype": dtype, "kind": kind}

    return {
        "source": "hand-written",
        "tensors": [
            entry("embed.weight", [10, 4]),
            entry("blocks.0.scale", [4], "bfloat16"),
            entry("blocks.0.proj.weight", [4, 4]),
            entry("blocks.0.proj.count", [], "int64", "buffer"),
            entry("blocks.1.proj.weight", [4, 4]),
            entry("head.weight", [10, 4]),
        ],
        "tied": [["embed.weight", "head.weight"]],
        "non_persistent_buffers": [
            {"name": "rotary.inv_freq", "shape": [2], "dtype": "float32"},
            {"name": "blocks.0.position_ids", "shape": [1, 3], "dtype": "int64"},
            {"name": "embed.embed_scale", "shape": [], "dtype": "bfloat16"},
        ],
    }


def test_spec_model_ties_and_kinds() -> None:
    spec = tiny_spec()
    model = SpecModel(spec)
    state = model.state_dict(keep_vars=True)
    assert list(state) == [t["name"] for t in spec["tensors"]]
    assert state["embed.weight"] is state["head.weight"]
    assert not isinstance(state["blocks.0.proj.count"], nn.Parameter)
    assert type(model.get_submodule("blocks.0")) is nn.Module
    described = spec_of(model)
    assert described["tied"] == [["embed.weight", "head.weight"]]
    assert spec_differences(spec, described) == []
    trimmed = SpecModel(spec, trim=["embed.weight"])
    assert "embed.weight" not in trimmed.state_dict() and "head.weight" in trimmed.state_dict()


def test_fill_non_persistent_materialises_every_one() -> None:
    model = SpecModel(tiny_spec())
    names = fill_non_persistent(model)
    assert sorted(names) == sorted(b["name"] for b in tiny_spec()["non_persistent_buffers"])
    buffers = non_persistent(model)
    assert not any(t.is_meta for t in buffers.values())
    assert torch.equal(buffers["blocks.0.position_ids"], torch.arange(3).reshape(1, 3))
    assert buffers["embed.embed_scale"].dtype == torch.bfloat16 and buffers["embed.embed_scale"].shape == ()
    assert torch.equal(buffers["rotary.inv_freq"], torch.tensor([1.0, 0.5]))
    assert all(t.is_meta for t in model.state_dict().values())  # weights untouched
    again = SpecModel(tiny_spec())
    fill_non_persistent(again)
    assert all(torch.equal(buffers[n], t) for n, t in non_persistent(again).items())


def test_fill_non_persistent_pi05(pi05_spec: dict) -> None:
    model = SpecModel(pi05_spec)
    assert len(fill_non_persistent(model)) == len(pi05_spec["non_persistent_buffers"])
    assert not any(t.is_meta for t in non_persistent(model).values())


def test_fill_non_persistent_without_reset_method() -> None:
    model = nn.Module()
    model.child = nn.Linear(2, 2, device="meta")
    model.child.register_buffer("ids", torch.empty(4, dtype=torch.int32, device="meta"), persistent=False)
    assert fill_non_persistent(model) == ["child.ids"]
    assert torch.equal(model.child.get_buffer("ids"), torch.arange(4, dtype=torch.int32))


def test_spec_differences_finds_mismatches() -> None:
    spec = tiny_spec()
    other = json.loads(json.dumps(spec))
    other["tensors"][2]["shape"] = [4, 5]
    other["tensors"][1]["dtype"] = "float32"
    other["tensors"][4], other["tensors"][5] = other["tensors"][5], other["tensors"][4]
    other["tensors"].pop(0)
    other["tied"] = []
    other["non_persistent_buffers"].pop()
    problems = spec_differences(spec, other)
    text = "\n".join(problems)
    for fragment in (
        "missing: embed.weight",
        "blocks.0.proj.weight: shape",
        "blocks.0.scale: dtype",
        "order differs",
        "tied in the spec only",
        "missing non-persistent buffer: embed.embed_scale",
    ):
        assert fragment in text, text


def test_load_spec_rejects_bad_entries(tmp_path: Path) -> None:
    spec = tiny_spec()
    spec["tensors"][1]["dtype"] = "bfloat17"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(spec))
    with pytest.raises(ModelError, match="blocks.0.scale.*bfloat17"):
        load_spec(path)


# --------------------------------------------------------------------------- lerobot


@pytest.fixture
def no_lerobot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "lerobot", None)  # makes `import lerobot` raise ImportError


def test_lerobot_missing_without_fallback(no_lerobot: None) -> None:
    with pytest.raises(LerobotUnavailableError) as info:
        build_model(ModelConfig(source="lerobot", spec=PI05))
    message = str(info.value)
    assert "lerobot is not importable here" in message
    assert f"(this is {sys.version_info.major}.{sys.version_info.minor}" in message
    assert "Python >= 3.12" in message


def test_lerobot_reason_names_only_requirements_this_interpreter_misses() -> None:
    missing = ModuleNotFoundError("No module named 'lerobot'", name="lerobot")
    met = lerobot_reason(missing, (3, 12, 3), "2.11.0+cu130")
    assert met.startswith("not installed (Python 3.12.3 and torch 2.11.0+cu130 would do)")
    assert "needs" not in met
    torch_only = lerobot_reason(missing, (3, 12, 3), "2.13.0+cpu")
    assert torch_only.startswith("lerobot 0.6 needs torch < 2.12 (this is 2.13.0+cpu); ")
    assert "Python >=" not in torch_only


def test_lerobot_missing_with_fallback(no_lerobot: None, pi05_spec: dict) -> None:
    info = build_model(ModelConfig(source="lerobot", spec=PI05, fallback="spec", trim=LM_HEADS))
    assert isinstance(info.module, SpecModel)
    assert info.source.startswith("spec:")
    assert info.source_note.startswith("lerobot not importable (")
    assert "built from spec" in info.source_note
    assert len(info.module.state_dict()) == 811


def install_fake_lerobot(monkeypatch: pytest.MonkeyPatch, spec: dict) -> None:
    """A stand-in ``lerobot`` whose ``PI05Pytorch`` is a module with the spec's tensors."""
    import types

    class PI05Config:
        def __init__(self, dtype: str, device: str) -> None:
            self.dtype, self.device = dtype, device
            self.paligemma_variant, self.action_expert_variant, self.chunk_size = "gemma_2b", "gemma_300m", 50

    class PI05Pytorch(SpecModel):
        def __init__(self, config: PI05Config) -> None:
            super().__init__(spec, device=torch.empty(0).device)  # the caller's default device

    class PolicyFeature:
        def __init__(self, type: str, shape: tuple[int, ...]) -> None:
            self.type, self.shape = type, shape

    modules: dict[str, dict[str, object]] = {
        "lerobot": {"__version__": "0.6.1"},
        "lerobot.configs": {},
        "lerobot.configs.types": {
            "FeatureType": types.SimpleNamespace(VISUAL="v", STATE="s", ACTION="a"),
            "PolicyFeature": PolicyFeature,
        },
        "lerobot.policies": {},
        "lerobot.policies.pi05": {},
        "lerobot.policies.pi05.configuration_pi05": {"PI05Config": PI05Config},
        "lerobot.policies.pi05.modeling_pi05": {"PI05Pytorch": PI05Pytorch},
    }
    for name, attrs in modules.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, module)


def test_lerobot_checked_against_spec(monkeypatch: pytest.MonkeyPatch, pi05_spec: dict) -> None:
    install_fake_lerobot(monkeypatch, pi05_spec)
    info = build_model(ModelConfig(source="lerobot", spec=PI05, trim=LM_HEADS))
    assert info.source == "lerobot 0.6.1" and "matches" in info.source_note
    state = info.module.state_dict(keep_vars=True)
    assert len(state) == 811 and not set(LM_HEADS) & set(state)
    assert all(t.is_meta for t in state.values())


def test_lerobot_mismatch_lists_differences(monkeypatch: pytest.MonkeyPatch, pi05_spec: dict) -> None:
    changed = json.loads(json.dumps(pi05_spec))
    for entry in changed["tensors"][:30]:
        entry["shape"] = [*entry["shape"], 1]
    install_fake_lerobot(monkeypatch, changed)
    with pytest.raises(SpecMismatchError) as info:
        build_model(ModelConfig(source="lerobot", spec=PI05, fallback="spec"))
    message = str(info.value)
    assert "differs from" in message and "in 30 ways" in message
    assert pi05_spec["tensors"][0]["name"] in message and "... and 10 more" in message
