"""Scenario loading: shipped scenarios load; every schema violation names the file and the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.models.checkpoints import default_checkpoint_path
from harness.scenario import ScenarioError, load_scenario
from harness.units import MIB

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "scenarios").glob("*.toml"))

BASE = """
name = "t"
strategies = ["map", "load"]

[model]
source = "synthetic"
layers = 2
width = 64
heads = 4
vocab = 128

[build]
engines = 2
"""


def write(tmp_path: Path, text: str, name: str = "s.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def spec_file(tmp_path: Path, names: tuple[str, ...] = ("a.weight", "b.weight")) -> Path:
    spec = {"tensors": [{"name": n, "shape": [2], "dtype": "float32", "kind": "param"} for n in names]}
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(spec))
    return path


def spec_scenario(spec: str, extra: str = "", source: str = "spec") -> str:
    return f'name = "t"\n[model]\nsource = "{source}"\nspec = "{spec}"\n{extra}\n[build]\nengines = 1\n'


def expect_error(path: Path, key: str, *fragments: str) -> ScenarioError:
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    message = str(info.value)
    assert path.name in message, message
    assert f"{key}:" in message, message
    for fragment in fragments:
        assert fragment in message, message
    return info.value


def test_shipped_scenarios_exist() -> None:
    names = {p.name for p in SHIPPED}
    assert {"smoke.toml", "pi05.toml", "pi05-trim.toml"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_scenario_loads(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    scenario = load_scenario(path)
    assert scenario.name == path.stem
    json.dumps(scenario.to_dict())  # JSON-able


def test_smoke_contents(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    s = load_scenario("scenarios/smoke.toml")
    assert s.model.source == "synthetic"
    assert s.strategies == ("map", "map_no_prefetch", "load", "load_file", "torch_mmap", "stream",
                            "read_file")  # listed in the file
    assert (s.run.prefetch, s.run.drop_cache, s.run.repeats) == ("auto", None, 5)  # chosen per run
    assert s.build.engines == 8 and s.build.engine_cap_mib is None
    assert (s.build.backend, s.build.device, s.run.cache) == ("copy", "auto", "cold")
    assert s.model.layers and s.model.width and s.model.vocab
    per_layer = 2 * s.model.width + (4 + 2 * s.model.ffn_mult) * s.model.width**2
    nbytes = 4 * (s.model.layers * per_layer + s.model.vocab * s.model.width + s.model.width)
    assert 200 * MIB < nbytes < 300 * MIB  # about 256 MiB
    assert s.checkpoint.path == default_checkpoint_path(s)


def test_pi05_contents(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    full = load_scenario("scenarios/pi05.toml")
    trim = load_scenario("scenarios/pi05-trim.toml")
    assert full.model.source == "lerobot" and full.model.fallback == "spec"
    assert full.model.spec == ROOT / "harness/specs/pi05.json"
    assert full.checkpoint.path == ROOT / "data/pi05.safetensors" and full.checkpoint.seed == 0
    assert full.build.engines == 16 and full.build.release is True
    assert full.run.memory_limit_gib == 22.0
    refs = {r.host_gpu_peak_gib: r for r in full.references}
    assert refs[7.07].host_at_partitioning_gib == 2.23
    assert refs[10.1].host_at_partitioning_gib is None
    assert all("different setup" in (r.label + r.note).lower() for r in full.references)
    assert set(trim.model.trim) == {
        "paligemma_with_expert.paligemma.lm_head.weight",
        "paligemma_with_expert.gemma_expert.lm_head.weight",
    }
    assert trim.checkpoint.path != full.checkpoint.path
    assert default_checkpoint_path(trim) != default_checkpoint_path(full)


def test_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    s = load_scenario(write(tmp_path, BASE))
    assert s.description == "" and s.references == ()
    assert s.model.ffn_mult == 4 and s.model.dtype == "float32"
    assert (s.build.backend, s.build.device, s.build.release) == ("copy", "auto", True)
    assert (s.run.cache, s.run.sample_interval_ms, s.run.residency_every) == ("cold", 10.0, 1)
    assert s.run.memory_limit_gib is None and s.run.timeout_s == 1800
    assert s.checkpoint.seed == 0
    assert s.checkpoint.path == tmp_path / "data" / f"{s.model.key}.safetensors"
    assert s.strategies == ("map", "load")


def test_unknown_top_level_key(tmp_path: Path) -> None:
    expect_error(write(tmp_path, BASE + 'nmae = "x"\n'), "nmae", "unknown key")


def test_unknown_nested_key(tmp_path: Path) -> None:
    expect_error(write(tmp_path, BASE.replace("engines = 2", "engines = 2\nengine = 3")), "build.engine")
    expect_error(write(tmp_path, BASE + "[run]\ncahce = 'cold'\n"), "run.cahce", "did you mean 'cache'")


def test_key_of_another_source(tmp_path: Path) -> None:
    expect_error(write(tmp_path, BASE.replace("vocab = 128", "vocab = 128\ntrim = []")), "model.trim")


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ("engines = 2", 'engines = "2"', "build.engines"),
        ("engines = 2", "engines = true", "build.engines"),
        ("engines = 2", "engines = 0", "build.engines"),
        ("layers = 2", "layers = 2.5", "model.layers"),
        ('name = "t"', "name = 3", "name"),
        ('name = "t"', 'name = "Bad Name"', "name"),
        ('strategies = ["map", "load"]', 'strategies = "map"', "strategies"),
        ('strategies = ["map", "load"]', 'strategies = ["map", "map"]', "strategies"),
        ('strategies = ["map", "load"]', "strategies = []", "strategies"),
        ("width = 64", "width = 66", "model.width"),
        ("[build]", "build = 3\n[run]", "build"),
    ],
)
def test_wrong_type_or_value(tmp_path: Path, old: str, new: str, key: str) -> None:
    assert old in BASE
    expect_error(write(tmp_path, BASE.replace(old, new, 1)), key)


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ('[run]\ncache = "lukewarm"\n', "run.cache"),
        ("[run]\nsample_interval_ms = -1\n", "run.sample_interval_ms"),
        ('[run]\nmemory_limit_gib = "22"\n', "run.memory_limit_gib"),
        ("[checkpoint]\nseed = -1\n", "checkpoint.seed"),
        ("[checkpoint]\npath = 3\n", "checkpoint.path"),
        ('[[reference]]\nnote = "x"\n', "reference[0].label"),
        ('[[reference]]\nlabel = "x"\nhost_gpu_peak_gib = "big"\n', "reference[0].host_gpu_peak_gib"),
    ],
)
def test_bad_values_in_tables(tmp_path: Path, extra: str, key: str) -> None:
    expect_error(write(tmp_path, BASE + extra), key)


def test_bad_enum_values(tmp_path: Path) -> None:
    expect_error(
        write(tmp_path, BASE.replace("engines = 2", 'engines = 2\nbackend = "onnx"')), "build.backend"
    )
    expect_error(write(tmp_path, BASE.replace("engines = 2", 'engines = 2\ndevice = "tpu"')), "build.device")
    expect_error(write(tmp_path, BASE.replace('"synthetic"', '"hub"')), "model.source", "'lerobot'")
    expect_error(write(tmp_path, BASE.replace("vocab = 128", 'vocab = 128\ndtype = "int8"')), "model.dtype")
    bad = BASE.replace('["map", "load"]', '["map", "mmap"]')
    expect_error(write(tmp_path, bad), "strategies", "'mmap'")


def test_engines_and_cap_both_or_neither(tmp_path: Path) -> None:
    both = BASE.replace("engines = 2", "engines = 2\nengine_cap_mib = 512")
    expect_error(write(tmp_path, both), "build.engines", "exactly one", "both")
    neither = BASE.replace("engines = 2", 'backend = "copy"')
    expect_error(write(tmp_path, neither), "build.engines", "exactly one", "neither")
    cap = load_scenario(write(tmp_path, BASE.replace("engines = 2", "engine_cap_mib = 512")))
    assert cap.build.engines is None and cap.build.engine_cap_mib == 512


def test_missing_required(tmp_path: Path) -> None:
    expect_error(write(tmp_path, BASE.replace('name = "t"', "")), "name", "missing")
    expect_error(write(tmp_path, BASE.replace("vocab = 128", "")), "model.vocab", "missing")


def test_missing_spec_file(tmp_path: Path) -> None:
    expect_error(write(tmp_path, spec_scenario("nowhere/spec.json")), "model.spec", "not found")


def test_spec_resolves_beside_scenario_then_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    (root / "scenarios").mkdir(parents=True)
    spec = spec_file(root)
    monkeypatch.chdir(root)
    from_root = load_scenario(write(root / "scenarios", spec_scenario("tiny.json")))
    assert from_root.model.spec == spec.resolve()
    beside = spec_file(root / "scenarios")
    from_dir = load_scenario(write(root / "scenarios", spec_scenario("tiny.json")))
    assert from_dir.model.spec == beside.resolve()


def test_trim_must_name_spec_tensors(tmp_path: Path) -> None:
    spec_file(tmp_path)
    ok = load_scenario(write(tmp_path, spec_scenario("tiny.json", 'trim = ["a.weight"]')))
    assert ok.model.trim == ("a.weight",)
    path = write(tmp_path, spec_scenario("tiny.json", 'trim = ["a.weight", "c.weight"]'))
    expect_error(path, "model.trim", "c.weight")


def test_trim_changes_default_checkpoint(tmp_path: Path) -> None:
    spec_file(tmp_path)
    plain = load_scenario(write(tmp_path, spec_scenario("tiny.json")))
    trimmed = load_scenario(write(tmp_path, spec_scenario("tiny.json", 'trim = ["b.weight"]')))
    assert plain.checkpoint.path != trimmed.checkpoint.path
    assert plain.model.key == "tiny"


def test_fallback_only_for_lerobot(tmp_path: Path) -> None:
    spec_file(tmp_path)
    ok = load_scenario(write(tmp_path, spec_scenario("tiny.json", 'fallback = "spec"', source="lerobot")))
    assert ok.model.fallback == "spec"
    expect_error(write(tmp_path, spec_scenario("tiny.json", 'fallback = "spec"')), "model.fallback")
    bad = spec_scenario("tiny.json", 'fallback = "synthetic"', source="lerobot")
    expect_error(write(tmp_path, bad), "model.fallback")


def test_missing_or_invalid_file(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="absent.toml.*not found"):
        load_scenario(tmp_path / "absent.toml")
    with pytest.raises(ScenarioError, match="broken.toml.*not valid TOML"):
        load_scenario(write(tmp_path, "name = \n", "broken.toml"))


def test_to_dict_round_trips_through_json(tmp_path: Path) -> None:
    text = BASE + '[[reference]]\nlabel = "elsewhere"\nhost_peak_gib = 3\n'
    data = json.loads(json.dumps(load_scenario(write(tmp_path, text)).to_dict()))
    assert data["name"] == "t" and data["build"]["engines"] == 2
    assert data["model"]["key"].startswith("synthetic-") and "spec" not in data["model"]
    assert data["references"] == [
        {
            "label": "elsewhere",
            "host_at_partitioning_gib": None,
            "host_gpu_peak_gib": None,
            "host_peak_gib": 3.0,
            "note": "",
        }
    ]


def test_generate_defaults_to_true_only_without_a_path(tmp_path: Path) -> None:
    assert load_scenario(write(tmp_path, BASE)).checkpoint.generate is True
    given = load_scenario(write(tmp_path, BASE + '[checkpoint]\npath = "c.safetensors"\n'))
    assert given.checkpoint.generate is False
    allowed = load_scenario(write(tmp_path, BASE + '[checkpoint]\npath = "c.safetensors"\ngenerate = true\n'))
    assert allowed.checkpoint.generate is True
    expect_error(write(tmp_path, BASE + "[checkpoint]\ngenerate = 1\n"), "checkpoint.generate", "true or false")


def test_engine_cap_that_rounds_to_zero_bytes(tmp_path: Path) -> None:
    tiny = BASE.replace("engines = 2", "engine_cap_mib = 1e-9")
    expect_error(write(tmp_path, tiny), "build.engine_cap_mib", "less than one byte")
    one_byte = load_scenario(write(tmp_path, BASE.replace("engines = 2", "engine_cap_mib = 0.000001")))
    assert int(one_byte.build.engine_cap_mib * MIB) == 1  # type: ignore[operator]


def test_non_utf8_scenario(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(BASE.replace('name = "t"', 'name = "t"\ndescription = "caf\xe9"').encode("latin-1"))
    with pytest.raises(ScenarioError, match=r"latin1.toml: not UTF-8 text \(invalid continuation byte at byte"):
        load_scenario(path)


def test_spec_that_is_not_json_or_not_a_spec(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{tensors: [}")
    expect_error(write(tmp_path, spec_scenario("bad.json")), "model.spec", "is not JSON (line 1")
    (tmp_path / "list.json").write_text("[1, 2]")
    expect_error(write(tmp_path, spec_scenario("list.json")), "model.spec", "is not a weight spec")
    (tmp_path / "bytes.json").write_bytes(b"\xff\xfe{}")
    expect_error(write(tmp_path, spec_scenario("bytes.json")), "model.spec", "is not UTF-8")
