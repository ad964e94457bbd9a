"""Numbers a scenario or the command line can hold are checked against their range before any work.

Every number out of range (too large for the machine, not finite, a model too large to
represent, a file nested without end) is one line ``error: <file>: <key>: <what>`` naming
the range, exit status 2, never a traceback and never after a checkpoint was generated. A
checkpoint that would not fit on its disk, or whose largest tensor would not fit in memory, is
refused before a byte of it is written.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from harness.cli import main
from harness.measure.sampler import Sampler
from harness.models import ModelError, SyntheticTransformer, build_model, load_spec
from harness.models.checkpoints import checkpoint_metadata, checkpoint_specs, ensure_checkpoint, file_bytes
from harness.plan import make_plan
from harness.scenario import (
    MAX_MODEL_BYTES,
    BuildConfig,
    CheckpointConfig,
    ModelConfig,
    Reference,
    RunConfig,
    Scenario,
    ScenarioError,
    load_scenario,
    synthetic_numel,
    validate_scenario,
)
from harness.scenario_rules import LIMITS
from harness.tests.tiny_scenario import tiny_scenario_text
from harness.units import GIB, TIB

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "scenarios").glob("*.toml"))



def write(tmp_path: Path, replace: dict[str, str] | None = None, extra: str = "") -> Path:
    text = tiny_scenario_text(tmp_path / "c.safetensors", {"name = \"tiny\"": "name = \"t\"", **(replace or {})}, extra)
    path = tmp_path / "s.toml"
    path.write_text(text)
    return path


def load_error(path: Path) -> str:
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    return str(info.value)


def cli_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run the command line: exit status 2 and one ``error:`` line, last, after progress lines only."""
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert lines and lines[-1].startswith("error: "), err
    assert sum(line.startswith("error:") for line in lines) == 1, err
    assert all(line.startswith(("[harness] ", "[budget] ", "generating ")) for line in lines[:-1]), err
    return lines[-1][len("error: "):]


# --------------------------------------------------------------------------- the scenario's numbers

OUT_OF_RANGE = [
    # (replace, extra, key, the range the message must state)
    ({"engines = 2": "engine_cap_mib = 1e308"}, "", "build.engine_cap_mib", "> 0 and <= 16777216 (MiB"),
    ({}, "[run]\nmemory_limit_gib = 1.7e308\n", "run.memory_limit_gib", ">= 0.0009765625 and <= 1048576 (GiB"),
    ({}, "[run]\nmemory_limit_gib = 1e-7\n", "run.memory_limit_gib", ">= 0.0009765625 and <= 1048576 (GiB"),
    ({}, "[run]\nmemory_limit_gib = " + "9" * 400 + "\n", "run.memory_limit_gib", "<= 1048576 (GiB"),
    ({"width = 64": "width = 2e40"}, "", "model.width", "an integer >= 1 and <= 65536"),
    ({"width = 64": "width = 20000000000000000000000000000000000000000"}, "", "model.width", ">= 1 and <= 65536"),
    ({"vocab = 64": "vocab = 1000000000000000"}, "", "model.vocab", "an integer >= 1 and <= 16777216"),
    ({"layers = 1": "layers = 9223372036854775807"}, "", "model.layers", "an integer >= 1 and <= 1024"),
    ({"vocab = 64": "vocab = 64\nffn_mult = 1000"}, "", "model.ffn_mult", ">= 1 and <= 64"),
    ({"engines = 2": "engines = 100000"}, "", "build.engines", "an integer >= 1 and <= 4096"),
    ({}, "[run]\nsample_interval_ms = 1e308\n", "run.sample_interval_ms", ">= 0.1 and <= 60000 (ms)"),
    ({}, "[run]\nsample_interval_ms = inf\n", "run.sample_interval_ms", ">= 0.1 and <= 60000 (ms)"),
    ({}, "[run]\ntimeout_s = nan\n", "run.timeout_s", "> 0 and <= 604800 (s"),
    ({}, "[run]\nrepeats = 1000000\n", "run.repeats", ">= 1 and <= 100"),
    ({}, "[run]\nwarmup = 1000\n", "run.warmup", ">= 0 and <= 100"),
    ({}, "[run]\nresidency_every = 1000000000000\n", "run.residency_every", ">= 1 and <= 100000"),
    ({"generate = true": "generate = true\nseed = 9223372036854775808"}, "", "checkpoint.seed",
     ">= 0 and <= 9223372036854775807"),
    ({}, '[[reference]]\nlabel = "x"\nhost_peak_gib = inf\n', "reference[0].host_peak_gib", ">= 0 and <= 1048576"),
]


@pytest.mark.parametrize(("replace", "extra", "key", "expected"), OUT_OF_RANGE,
                         ids=[f"{case[2]}-{i}" for i, case in enumerate(OUT_OF_RANGE)])
def test_a_number_out_of_its_range_is_refused_with_the_range(
    tmp_path: Path, replace: dict[str, str], extra: str, key: str, expected: str
) -> None:
    path = write(tmp_path, replace, extra)
    message = load_error(path)
    assert message.startswith(f"{path}: {key}: expected "), message
    assert expected in message, message
    assert len(message) < 300 and "\n" not in message, "one short line, even for a 400-digit number"


def test_the_range_edges_are_accepted(tmp_path: Path) -> None:
    path = write(tmp_path, {"layers = 1": "layers = 1024", "engines = 2": "engines = 4096"},
                 "[run]\nsample_interval_ms = 0.1\nmemory_limit_gib = 0.0009765625\ntimeout_s = 604800\n"
                 "repeats = 100\nwarmup = 100\n")
    scenario = load_scenario(path)
    assert scenario.model.layers == 1024 and scenario.build.engines == 4096
    assert scenario.run.memory_limit_gib == 2**-10 and scenario.run.timeout_s == 604800.0
    validate_scenario(scenario)


def test_a_model_too_large_to_represent_is_refused_before_it_is_built(tmp_path: Path) -> None:
    path = write(tmp_path, {"layers = 1": "layers = 1024", "width = 64": "width = 65536"})
    message = load_error(path)
    assert message.startswith(f"{path}: model: layers 1024, width 65536, vocab 64, ffn_mult 4 in float32 come to ")
    assert message.endswith(f"a model may have at most {MAX_MODEL_BYTES:,} bytes (16 TiB)")


def test_the_size_check_counts_what_the_model_holds() -> None:
    for layers, width, vocab, ffn_mult in ((1, 64, 64, 4), (3, 128, 1000, 2), (2, 96, 7, 8)):
        model = SyntheticTransformer(layers=layers, width=width, vocab=vocab, ffn_mult=ffn_mult, heads=4)
        unique = {id(t): t for t in model.state_dict(keep_vars=True).values()}
        assert sum(t.numel() for t in unique.values()) == synthetic_numel(
            layers=layers, width=width, vocab=vocab, ffn_mult=ffn_mult)


def _spec(tmp_path: Path, tensors: list[dict[str, Any]]) -> Path:
    path = tmp_path / "big.json"
    path.write_text(json.dumps({"tensors": tensors}))
    return path


def _spec_scenario(tmp_path: Path, spec: Path) -> Path:
    path = tmp_path / "spec.toml"
    path.write_text(f'name = "t"\n[model]\nsource = "spec"\nspec = "{spec}"\n[build]\nengines = 1\n')
    return path


@pytest.mark.parametrize(("shape", "fragment"), [
    ([TIB, TIB], "its tensors come to "),
    ([0, 10**30], "has a dimension of 1,000,000,000,000,000,000,000,000,000,000; at most"),
])
def test_a_spec_too_large_to_represent_is_refused(tmp_path: Path, shape: list[int], fragment: str) -> None:
    spec = _spec(tmp_path, [{"name": "w", "shape": shape, "dtype": "float32", "kind": "param"}])
    path = _spec_scenario(tmp_path, spec)
    message = load_error(path)
    assert message.startswith(f"{path}: model.spec: {spec} "), message
    assert fragment in message, message


def test_a_spec_with_too_many_tensors_is_refused(tmp_path: Path) -> None:
    tensors = [{"name": f"t{i}", "shape": [1], "dtype": "float32", "kind": "param"} for i in range(100_001)]
    path = _spec_scenario(tmp_path, _spec(tmp_path, tensors))
    assert "lists 100,001 tensors and buffers; a weight spec may list at most 100,000" in load_error(path)


# --------------------------------------------------------------------------- nesting without end


def test_arrays_nested_without_end_in_the_scenario_are_one_error(tmp_path: Path) -> None:
    path = tmp_path / "deep.toml"
    path.write_text('name = "t"\nx = ' + "[" * 100_000 + "]" * 100_000 + "\n")
    message = load_error(path)
    assert message == (f"{path}: not valid TOML here: arrays or tables nest too deeply to parse "
                       "(a scenario nests at most 8 levels)")


def test_tables_nested_deeply_under_a_known_key_are_refused_by_key(tmp_path: Path) -> None:
    path = write(tmp_path, extra="[run.cache." + ".".join(["a"] * 3000) + "]\nb = 1\n")
    message = load_error(path)
    assert message.startswith(f"{path}: run.cache.a.a.a.a.a"), message
    assert message.endswith("arrays and tables nest more than 8 levels deep (a scenario needs 3)")


def test_a_spec_nested_without_end_is_one_error(tmp_path: Path) -> None:
    spec = tmp_path / "deep.json"
    spec.write_text('{"tensors": ' + "[" * 100_000 + "]" * 100_000 + "}")
    path = _spec_scenario(tmp_path, spec)
    assert load_error(path) == (f"{path}: model.spec: {spec} is not a weight spec: arrays and objects nest "
                                "100001 levels deep; at most 16 (a weight spec needs 4)")
    with pytest.raises(ModelError, match="nest 100001 levels deep; at most 16"):
        load_spec(spec)


def test_an_integer_of_more_digits_than_python_converts_is_one_error(tmp_path: Path) -> None:
    path = write(tmp_path, {"vocab = 64": "vocab = " + "1" * 5000})
    assert load_error(path).startswith(f"{path}: not valid TOML here: Exceeds the limit (4300 digits)")


# --------------------------------------------------------------------------- the sampler


@pytest.mark.parametrize("interval_s", [1e305, math.inf, math.nan, 0.0])
def test_the_sampler_refuses_an_interval_its_thread_cannot_wait(interval_s: float) -> None:
    with pytest.raises(ValueError, match="interval_s must be positive and at most"):
        Sampler(interval_s=interval_s)


# --------------------------------------------------------------------------- before any work


def test_numbers_are_checked_before_the_checkpoint_is_generated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, extra="[run]\nmemory_limit_gib = 1.7e308\n")
    message = cli_error(capsys, "run", str(path), "--results", str(tmp_path / "results"))
    assert message.startswith(f"{path}: run.memory_limit_gib: expected a number >= 0.0009765625 and <= 1048576")
    assert not (tmp_path / "c.safetensors").exists()
    assert not (tmp_path / "results").exists()


def test_a_scenario_built_in_code_is_checked_by_the_plan(tmp_path: Path) -> None:
    scenario = Scenario(
        name="t", model=ModelConfig(source="synthetic", layers=1, width=64, heads=4, vocab=64),
        checkpoint=CheckpointConfig(path=tmp_path / "c.safetensors", generate=True),
        build=BuildConfig(engine_cap_mib=1e308, device="cpu"), run=RunConfig(sample_interval_ms=math.inf))
    with pytest.raises(ScenarioError, match=r"scenario 't': build.engine_cap_mib: expected a number > 0"):
        make_plan(scenario, name="t", workdir=tmp_path / "engines")
    assert not (tmp_path / "c.safetensors").exists()



@pytest.mark.parametrize(("change", "expected"), [
    ({"name": "../elsewhere"}, "scenario '../elsewhere': name: expected [a-z0-9_-]+"),
    ({"strategies": ("map", "no_such")}, "scenario 't': strategies:"),
    ({"run": RunConfig(prefetch="sometimes")}, "scenario 't': run.prefetch: expected one of 'auto', 'off'"),
    ({"build": BuildConfig(weights="copied", device="cpu")}, "scenario 't': build.weights: expected one of"),
    ({"references": (Reference(label="r", host_peak_gib=-1.0),)},
     "scenario 't': references[0].host_peak_gib: expected a number >= 0"),
])
def test_a_scenario_built_in_code_meets_every_rule_the_loader_applies(
    tmp_path: Path, change: dict[str, Any], expected: str
) -> None:
    scenario = dataclasses.replace(Scenario(
        name="t", model=ModelConfig(source="synthetic", layers=1, width=64, heads=4, vocab=64),
        checkpoint=CheckpointConfig(path=tmp_path / "c.safetensors", generate=True),
        build=BuildConfig(device="cpu")), **change)
    with pytest.raises(ScenarioError) as info:
        validate_scenario(scenario)
    assert str(info.value).startswith(expected), info.value

@pytest.mark.parametrize(("flag", "value", "expected"), [
    ("--precision-mib", "nan", "--precision-mib nan: expected a number >= 1 and <= 1048576 (MiB, 1 TiB)"),
    ("--precision-mib", "inf", "--precision-mib inf: expected a number >= 1 and <= 1048576 (MiB, 1 TiB)"),
    ("--precision-mib", "1e400", "--precision-mib inf: expected a number >= 1 and <= 1048576 (MiB, 1 TiB)"),
    ("--timeout-factor", "nan", "--timeout-factor nan: expected a number > 1 and <= 1000"),
    ("--timeout-factor", "inf", "--timeout-factor inf: expected a number > 1 and <= 1000"),
])
def test_budget_settings_that_are_not_finite_are_refused_before_the_sweep(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    flag: str, value: str, expected: str
) -> None:
    import harness.budget.mode as mode

    def sweep(*args: object, **kwargs: object) -> None:
        raise AssertionError("the sweep started")

    monkeypatch.setattr(mode, "run_budget", sweep)
    path = write(tmp_path)
    assert cli_error(capsys, "budget", str(path), "--results", str(tmp_path / "results"), flag, value) == expected
    assert not (tmp_path / "results").exists() and not (tmp_path / "c.safetensors").exists()


def test_every_shipped_scenario_is_inside_the_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    assert SHIPPED
    for path in SHIPPED:
        scenario = load_scenario(path)
        validate_scenario(scenario)  # what the plan checks first
        assert LIMITS["run.timeout_s"].accepts(scenario.run.timeout_s)


# --------------------------------------------------------------------------- disk and memory


def test_the_size_a_checkpoint_is_given_bounds_the_file_written(tmp_path: Path) -> None:
    model = SyntheticTransformer(layers=2, width=64, vocab=300, heads=4, dtype=torch.bfloat16)
    path, _ = ensure_checkpoint(model, tmp_path / "m.safetensors", 2**63 - 1, progress=False)
    size = path.stat().st_size
    estimate = file_bytes(checkpoint_specs(model), checkpoint_metadata(2**63 - 1))
    assert size <= estimate <= size + 4096


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs (root only; skipped where it cannot be mounted)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root")
    where = tmp_path / f"disk-{uuid.uuid4().hex[:8]}"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


def test_a_checkpoint_larger_than_the_free_disk_is_refused_before_writing(
    tmp_path: Path, small_disk: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = small_disk / "c.safetensors"
    path = write(tmp_path, {str(tmp_path / "c.safetensors"): str(checkpoint), "layers = 1": "layers = 4",
                            "width = 64": "width = 256"})  # 12.1 MiB of float32 weights
    message = cli_error(capsys, "run", str(path), "--results", str(tmp_path / "results"))
    assert message.startswith(f"{path}: checkpoint.path: {checkpoint}: generating it needs 12.")
    assert f"on disk, and {small_disk} has " in message and " MiB (" in message
    assert message.endswith("free; free some space or set checkpoint.path to a disk with room")
    assert list(small_disk.iterdir()) == [], "nothing was written"


def test_a_checkpoint_whose_largest_tensor_exceeds_memory_is_refused_before_writing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    memory = psutil.virtual_memory().total + psutil.swap_memory().total
    width = 4096
    vocab = math.ceil(1.5 * memory / (4 * width))  # an embedding half as large again as the memory
    if vocab > LIMITS["model.vocab"].high:
        pytest.skip("this machine has more memory than the largest vocabulary can exceed")
    model = build_model(ModelConfig(source="synthetic", layers=1, width=width, heads=8, vocab=vocab))
    needed = file_bytes(checkpoint_specs(model.module), checkpoint_metadata(0))
    if shutil.disk_usage(tmp_path).free < needed:
        pytest.skip(f"{tmp_path} has less than the {needed / GIB:.0f} GiB free that get past the disk check")
    path = write(tmp_path, {"width = 64": f"width = {width}", "heads = 4": "heads = 8", "vocab = 64":
                            f"vocab = {vocab}"})
    message = cli_error(capsys, "run", str(path), "--results", str(tmp_path / "results"))
    assert message.startswith(f"{path}: checkpoint.path: {tmp_path / 'c.safetensors'}: generating it holds its "
                              "largest tensor (")
    assert "available; generate it on a machine with more memory, or use a smaller model" in message
    assert not (tmp_path / "c.safetensors").exists()
