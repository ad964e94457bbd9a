"""``model.source = "factory"`` and ``"transformers"``: a user's own model, built empty, named, given its inputs.

Models the tests make themselves (:mod:`harness.tests.user_models`); nothing runs a strategy here
(:mod:`harness.tests.test_cli_model` does).
"""

from __future__ import annotations

import dataclasses
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from harness.engines.compile.entry import EntryError, export_entry
from harness.models import ModelError, build_model, fill_non_persistent
from harness.models.checkpoints import checkpoint_specs
from harness.models.user_checkpoint import resolve_checkpoint
from harness.scenario import (
    CheckpointConfig,
    ModelConfig,
    ScenarioError,
    default_checkpoint_for,
    default_generate,
    parse_scenario,
)
from harness.tests.user_models import FACTORY, FACTORY_MODULE, write_factory, write_llama
from weightmap import read_header


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``tmp_path`` as the working directory, ``sys.path`` and the user's module restored after."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in [n for n in sys.modules if n.startswith(("tied_user_model", "broken_", "user_"))]:
        monkeypatch.delitem(sys.modules, name)
    yield tmp_path
    for name in [n for n in sys.modules if n.startswith(("tied_user_model", "broken_", "user_"))]:
        del sys.modules[name]


def factory(spec: str = FACTORY, **more: object) -> ModelConfig:
    return ModelConfig(source="factory", factory=spec, **more)  # type: ignore[arg-type]


def test_a_factory_model_is_built_on_meta_with_its_tie_and_its_buffers_values_given_back(here: Path) -> None:
    checkpoint = write_factory(here)
    info = build_model(factory())
    model = info.module
    assert all(t.is_meta for t in [*model.parameters(), *model.buffers()])
    assert model.head.weight is model.embed.weight  # type: ignore[union-attr]
    assert info.source == f"factory {FACTORY}" and FACTORY in info.source_note
    assert fill_non_persistent(model) == ["scale"]
    # the values its __init__ computed
    assert torch.equal(model.get_buffer("scale"), torch.arange(32, dtype=torch.float32) / 32 + 1.0)
    # the checkpoint save_model wrote holds the tie once, under the name the harness reads it by
    specs = {s.name: (s.dtype, s.shape) for s in checkpoint_specs(build_model(factory()).module)}
    header = read_header(checkpoint)
    assert {n: (e.dtype, tuple(e.shape)) for n, e in header.tensors.items()} == specs
    resolved = resolve_checkpoint(build_model(factory()).module, CheckpointConfig(checkpoint), str, progress=False)
    assert (resolved.path, resolved.info.generated) == (checkpoint, False)


@pytest.mark.parametrize(("source", "message"), [
    ("", "model.factory user_absent:make: cannot import user_absent from {here} or the installed packages "
         "(ModuleNotFoundError: No module named 'user_absent')"),
    ("def other(): pass\n", "model.factory user_{n}:make: module user_{n} ({here}/user_{n}.py) has no 'make'"),
    ("def make():\n    raise RuntimeError('no GPU here')\n",
     "model.factory user_{n}:make raised RuntimeError: no GPU here"),
    ("def make():\n    return 3\n", "model.factory user_{n}:make returned builtins.int, not a torch.nn.Module"),
    ("import torch\nBUILT = torch.nn.Linear(2, 2)\ndef make():\n    return BUILT\n",
     "model.factory user_{n}:make returned a model whose parameters weight, bias are not on the meta device"),
    ("raise ImportError('needs a GPU build')\n",
     "model.factory user_{n}:make: cannot import user_{n} from {here} or the installed packages "
     "(ImportError: needs a GPU build)"),
])
def test_a_factory_that_cannot_build_a_model_says_which_and_why(here: Path, source: str, message: str) -> None:
    n = f"{zlib.crc32(source.encode()):08x}"  # a module name of its own: imported modules stay cached
    spec = "user_absent:make" if not source else f"user_{n}:make"
    if source:
        (here / f"user_{n}.py").write_text(source)
    with pytest.raises(ModelError) as raised:
        build_model(factory(spec))
    assert str(raised.value).startswith(message.format(here=here, n=n))


def test_a_factory_spec_that_is_not_module_colon_function_is_refused_by_the_loader(here: Path) -> None:
    with pytest.raises(ScenarioError, match=r"^cli: model.factory: expected package.module:function, got 'a.b'"):
        parse_scenario({"name": "x", "model": {"source": "factory", "factory": "a.b"}, "build": {"engines": 1}},
                       shown="cli", base=here)


def test_user_sources_default_to_not_generating_and_a_transformers_checkpoint_to_its_folder(here: Path) -> None:
    folder = write_llama(here / "llama")
    data = {"name": "x", "model": {"source": "transformers", "config": "llama"}, "build": {"engines": 1},
            "checkpoint": {"path": "llama/model.safetensors"}}
    scenario = parse_scenario(data, shown="cli", base=here)
    assert scenario.model.config == folder / "config.json" and scenario.checkpoint.generate is False
    assert default_checkpoint_for(scenario.model) == folder
    assert not default_generate(scenario.model, path_given=False)
    assert not default_generate(factory(), path_given=False)
    assert default_generate(ModelConfig(layers=1, width=8, vocab=8), path_given=False)


def test_model_keys_differ_with_the_factory_and_the_config(here: Path) -> None:
    write_llama(here / "a")
    write_llama(here / "b", vocab=96)
    a, b = (ModelConfig(source="transformers", config=here / d / "config.json") for d in "ab")
    assert a.key.startswith("llama-") and b.key.startswith("llama-") and a.key != b.key
    assert factory("m:make").key.startswith("factory-make-") and factory("m:make").key != factory("n:make").key


def test_a_transformers_model_is_its_architecture_empty_tied_with_transformers_rotary_values(here: Path) -> None:
    import transformers

    folder = write_llama(here / "llama")
    info = build_model(ModelConfig(source="transformers", config=folder / "config.json"))
    model = info.module
    assert type(model) is transformers.LlamaForCausalLM
    assert info.source == "transformers LlamaForCausalLM llama/config.json"
    assert all(t.is_meta for t in [*model.parameters(), *model.buffers()])
    assert model.lm_head.weight is model.model.embed_tokens.weight
    fill_non_persistent(model)
    real = transformers.LlamaForCausalLM(transformers.AutoConfig.from_pretrained(folder))
    assert torch.equal(model.model.rotary_emb.inv_freq, real.model.rotary_emb.inv_freq)
    # save_pretrained stored the tie once, under the name the harness reads it by
    header = read_header(folder / "model.safetensors")
    assert set(header.tensors) == {s.name for s in checkpoint_specs(model)}


def test_a_transformers_folder_without_config_or_with_an_unknown_architecture_is_refused(here: Path) -> None:
    (here / "empty").mkdir()
    data = {"name": "x", "model": {"source": "transformers", "config": "empty"}, "build": {"engines": 1}}
    with pytest.raises(ScenarioError, match=rf"^cli: model.config: {here}/empty holds no config.json"):
        parse_scenario(data, shown="cli", base=here)
    folder = write_llama(here / "llama")
    text = (folder / "config.json").read_text().replace('"LlamaForCausalLM"', '"NoSuchForCausalLM"')
    (folder / "config.json").write_text(text)
    with pytest.raises(ModelError, match="^llama/config.json: architectures names 'NoSuchForCausalLM', which "
                                         "transformers .* does not have$"):
        build_model(ModelConfig(source="transformers", config=folder / "config.json"))


def test_without_transformers_the_source_says_to_install_it(here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = write_llama(here / "llama")
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers: ImportError
    with pytest.raises(ModelError, match=r"needs the transformers package, .*: pip install transformers$"):
        build_model(ModelConfig(source="transformers", config=folder / "config.json"))


def test_inputs_default_to_token_ids_or_come_from_model_inputs(here: Path) -> None:
    write_factory(here)
    model = build_model(factory()).module
    entry = export_entry(factory(), model, tokens=5)
    assert entry.module is model and entry.kwargs == {}
    (ids,) = entry.args
    assert ids.shape == (1, 5) and ids.dtype == torch.int64 and int(ids.max()) < 64
    given = export_entry(factory(inputs=f"{FACTORY_MODULE}:token_inputs"), model, tokens=5)
    assert given.args == () and torch.equal(given.kwargs["input_ids"], torch.arange(8).reshape(1, 8))
    folder = write_llama(here / "llama", vocab=40)
    config = ModelConfig(source="transformers", config=folder / "config.json")
    (llama_ids,) = export_entry(config, build_model(config).module, tokens=3).args
    assert llama_ids.shape == (1, 3) and int(llama_ids.max()) < 40


def test_inputs_that_are_not_tensors_or_a_model_without_token_ids_are_refused(here: Path) -> None:
    write_factory(here)
    (here / "user_inputs_bad.py").write_text("def inputs(model):\n    return [1, 2]\n")
    model = build_model(factory()).module
    with pytest.raises(EntryError, match=r"^model.inputs user_inputs_bad:inputs returned a list of int: expected a "
                                         r"tensor, a tuple of tensors or a dict of tensors$"):
        export_entry(factory(inputs="user_inputs_bad:inputs"), model, tokens=4)
    (here / "user_conv.py").write_text("import torch\ndef make():\n    return torch.nn.Conv2d(3, 3, 1)\n")
    conv = factory("user_conv:make")
    with pytest.raises(EntryError, match=r"^Conv2d.forward takes neither input_ids first nor starts with an "
                                         r"nn.Embedding: give model.inputs"):
        export_entry(conv, build_model(conv).module, tokens=4)


def test_a_scenario_built_in_code_with_a_user_source_passes_validation(here: Path) -> None:
    from harness.scenario import BuildConfig, CheckpointConfig, Scenario, validate_scenario

    checkpoint = write_factory(here)
    scenario = Scenario(name="x", model=factory(), checkpoint=CheckpointConfig(path=checkpoint),
                        build=BuildConfig(engines=1))
    validate_scenario(scenario)
    with pytest.raises(ScenarioError, match="model.factory: expected package.module:function"):
        validate_scenario(dataclasses.replace(scenario, model=factory("not a function")))
