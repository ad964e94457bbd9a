"""``python -m harness run --model SPEC --checkpoint PATH ...``: a user's own model measured from one command.

Bad input is one line ``error: ...``, exit status 2, nothing published. A factory model (a tied head, a
non-persistent buffer; its checkpoint saved with ``safetensors.torch.save_model``) and a tiny Llama folder
(``save_pretrained``) are each measured with the copy backend (every strategy) and AOTInductor packaged, and the
``scenario.toml`` a run publishes reads back to the scenario it ran.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from harness.cli import main
from harness.plan import read_plan
from harness.results.record import PLAN
from harness.scenario import load_scenario
from harness.scenario_file import SCENARIO_FILE
from harness.tests.test_cli import error_of
from harness.tests.user_models import FACTORY, FACTORY_MODULE, write_factory, write_llama
from harness.units import GIB

MAP_EXCESS = 0.02
"""The most ``map``'s build-phase host peak may lie above its floor (baseline + largest engine), as a share of the
model: it holds one engine's pages at a time, so only the process's own few MiB beside them (which is why the models
measured here are of half a GiB and more: on a model of a few dozen MiB those MiB alone pass 2%); ``load``, which
holds the whole model twice, lies near 1 or above."""


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in [n for n in sys.modules if n.startswith((FACTORY_MODULE, "user_"))]:
        monkeypatch.delitem(sys.modules, name)
    return tmp_path


def published(here: Path) -> list[str]:
    results = here / "results"
    return sorted(p.name for p in results.iterdir()) if results.exists() else []


def model_error(capsys: pytest.CaptureFixture[str], here: Path, *argv: str) -> str:
    message = error_of(capsys, "run", *argv, "--results", str(here / "results"))
    assert published(here) == [], "nothing is published"
    return message


# --------------------------------------------------------------------------- bad input


def test_a_factory_that_does_not_import_or_build_is_one_line(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--checkpoint", "none.safetensors", "--engines", "2")
    assert model_error(capsys, here, "--model", "user_absent:make", *args) == (
        f"model.factory user_absent:make: cannot import user_absent from {here} or the "
        "installed packages (ModuleNotFoundError: No module named 'user_absent')")
    (here / "user_m.py").write_text("import torch\ndef make():\n    return {'w': torch.zeros(2)}\n"
                                    "def boom():\n    raise ValueError('bad size')\n")
    assert model_error(capsys, here, "--model", "user_m:nothing", *args).endswith(
        f"model.factory user_m:nothing: module user_m ({here}/user_m.py) has no 'nothing'")
    assert model_error(capsys, here, "--model", "user_m:boom", *args).endswith(
        "model.factory user_m:boom raised ValueError: bad size")
    assert model_error(capsys, here, "--model", "user_m:make", *args).endswith(
        "model.factory user_m:make returned builtins.dict, not a torch.nn.Module")


def test_a_config_folder_that_is_not_a_model_is_one_line(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (here / "empty").mkdir()
    assert model_error(capsys, here, "--model", "empty", "--engines", "2") == (
        f"the command line: model.config: {here}/empty holds no config.json (a transformers model's folder does)")
    folder = write_llama(here / "llama")
    capsys.readouterr()  # transformers' own progress bar
    (folder / "config.json").write_text((folder / "config.json").read_text().replace("LlamaForCausalLM", "NoSuchLM"))
    assert model_error(capsys, here, "--model", "llama", "--checkpoint", "llama/model.safetensors",
                       "--engines", "2").endswith(
        "llama/config.json: architectures names 'NoSuchLM', which transformers "
        f"{__import__('transformers').__version__} does not have")


def test_without_transformers_a_config_is_one_line_saying_to_install_it(
    here: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    write_llama(here / "llama")
    capsys.readouterr()  # transformers' own progress bar
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers: ImportError
    message = model_error(capsys, here, "--model", "llama", "--checkpoint", "llama/model.safetensors", "--engines", "2")
    assert message.startswith("model.source = \"transformers\" needs the transformers "
                              "package") and message.endswith(": pip install transformers")


def test_inputs_that_are_not_tensors_is_one_line(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_factory(here)
    (here / "user_in.py").write_text("def inputs(model):\n    return 'tokens'\n")
    message = model_error(capsys, here, "--model", FACTORY, "--checkpoint", "tied.safetensors", "--engines", "2",
                          "--backend", "inductor", "--inputs", "user_in:inputs")
    assert message == ("scenario 'make_tied': model: model.inputs user_in:inputs returned a str: expected a tensor, "
                       "a tuple of tensors or a dict of tensors")


def test_flags_that_contradict_are_one_line(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = here / "s.toml"
    file.write_text('name = "s"\n')
    assert model_error(capsys, here, str(file), "--model", FACTORY) == (
        f"{file} and --model: give a scenario file or --model, not both")
    assert model_error(capsys, here, str(file), "--engines", "2") == (
        f"--engines: goes with --model; {file} sets it in its own file")
    assert model_error(capsys, here, "--model", FACTORY, "--engines", "2", "--engine-cap-mib", "1") == (
        "--engines and --engine-cap-mib: give one of them (how many engines, or the most MiB of weights per "
        "engine), not both")
    assert model_error(capsys, here, "--engines", "2").startswith("give a scenario file")
    assert model_error(capsys, here, "--model", FACTORY, "--engines", "0") == (
        "the command line: build.engines: expected an integer >= 1 and <= 4096, got 0 (int)")
    assert error_of(capsys, "budget", str(file), "--model", FACTORY) == (
        f"{file} and --model: give a scenario file or --model, not both")


# --------------------------------------------------------------------------- runs


def run_model(here: Path, *argv: str) -> tuple[dict, Path]:
    """Run the command line; it must exit 0; the summary and the results directory."""
    assert main(["run", *argv, "--results", str(here / "results")]) == 0
    (directory,) = [p for p in (here / "results").iterdir() if p.is_dir()]
    return json.loads((directory / "summary.json").read_text()), directory


def assert_every_strategy_ok_and_map_at_the_floor(summary: dict) -> None:
    strategies = summary["strategies"]
    assert all(s["status"] == "ok" for s in strategies.values()), {k: s["error"] for k, s in strategies.items()}
    assert strategies["map"]["excess_over_floor"] <= MAP_EXCESS, strategies["map"]["excess_over_floor"]
    assert strategies["load"]["excess_over_floor"] > strategies["map"]["excess_over_floor"]


def assert_the_published_scenario_reads_back_to_the_one_run(directory: Path) -> None:
    ran = read_plan(directory / PLAN).scenario
    again = load_scenario(directory / SCENARIO_FILE)
    assert ran.path is None and again.path == (directory / SCENARIO_FILE).resolve()
    assert dataclasses.replace(again, path=None) == ran


def test_a_factory_model_measured_from_one_command(here: Path) -> None:
    write_factory(here, vocab=65536, width=2048)  # 560 MiB, the 512 MiB embedding tied to the head, stored once
    summary, directory = run_model(here, "--model", FACTORY, "--checkpoint", "tied.safetensors", "--engines", "4")
    assert directory.name == "make_tied"
    assert summary["model"]["source"] == f"factory {FACTORY}"
    assert_every_strategy_ok_and_map_at_the_floor(summary)
    assert_the_published_scenario_reads_back_to_the_one_run(directory)
    assert (here / "results" / "make_tied.md").read_text().count(f"`factory {FACTORY}`") == 1


def test_a_transformers_folder_measured_from_one_command(here: Path) -> None:
    write_llama(here / "llama", vocab=65536, hidden=2048, max_shard_size="200MB")  # 0.8 GiB in several shards + index
    assert len(list((here / "llama").glob("model-0000?-of-0000?.safetensors"))) > 1
    summary, directory = run_model(here, "--model", "llama", "--engines", "4", "--repeats", "1")  # its folder
    assert directory.name == "llama"
    assert summary["model"]["source"] == "transformers LlamaForCausalLM llama/config.json"
    assert_every_strategy_ok_and_map_at_the_floor(summary)
    assert_the_published_scenario_reads_back_to_the_one_run(directory)


@pytest.mark.parametrize("model", ["factory", "transformers"])
def test_a_user_model_built_by_aot_inductor_packaged(here: Path, model: str) -> None:
    argv: tuple[str, ...]
    if model == "factory":
        write_factory(here)
        argv = ("--model", FACTORY, "--checkpoint", "tied.safetensors", "--inputs", f"{FACTORY_MODULE}:token_inputs")
    else:
        write_llama(here / "llama")
        argv = ("--model", "llama", "--checkpoint", "llama/model.safetensors")
    summary, directory = run_model(here, *argv, "--engines", "1", "--backend", "inductor", "--weights", "packaged",
                                   "--strategies", "map", "--name", "aoti")
    entry = summary["strategies"]["map"]
    assert entry["status"] == "ok", entry["error"]
    assert entry["compiler_weights"] == "packaged"
    assert entry["max_abs_diff"] is not None and entry["max_abs_diff"] < 1e-4  # the engines' output is eager's
    assert_the_published_scenario_reads_back_to_the_one_run(directory)


# --------------------------------------------------------------------------- predict --model


def test_predict_a_factory_model_from_the_flags_of_run(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``predict --model`` builds the scenario ``run --model`` would from the same flags and predicts it from the
    checkpoint's headers: map holds the largest engine above the baseline, load twice the model while loading."""
    from harness.predict.scenario import header_bytes

    checkpoint = write_factory(here)
    argv = ["--model", FACTORY, "--checkpoint", "tied.safetensors", "--engines", "2", "--strategies", "map,load"]
    assert main(["predict", *argv, "--json", "--baseline-gib", "0.25"]) == 0
    data = json.loads(capsys.readouterr().out)
    baseline = int(0.25 * GIB)
    assert list(data["strategies"]) == ["map", "load"] and data["engines"] == 2
    assert data["model_bytes"] == header_bytes(checkpoint) and data["source"].startswith("the headers of")
    assert data["strategies"]["map"]["build_peak_bytes"] == baseline + data["largest_engine_bytes"]
    assert data["strategies"]["load"]["host_peak_bytes"] == baseline + 2 * data["model_bytes"]


@pytest.mark.parametrize("argv, words", [
    (["--model", FACTORY, "--checkpoint", "tied.safetensors"], "--model needs --engines N or --engine-cap-mib M"),
    (["--model", "user_absent:make", "--checkpoint", "tied.safetensors", "--engines", "2"],
     "cannot import user_absent"),
    (["S", "--model", FACTORY], "give a scenario file or --model, not both"),
    (["--check", "results", "--model", FACTORY], "takes no scenario, --model"),
])
def test_predict_model_bad_input_is_one_line_and_exit_2(here: Path, capsys: pytest.CaptureFixture[str],
                                                        argv: list[str], words: str) -> None:
    write_factory(here)
    (here / "s.toml").write_text("")
    argv = [str(here / "s.toml") if a == "S" else a for a in argv]
    assert words in error_of(capsys, "predict", *argv, "--baseline-gib", "0.25")
