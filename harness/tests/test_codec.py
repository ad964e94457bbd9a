"""The codec of :mod:`harness.fileio.codec`: strict reading, layout versions, and a round trip of every record."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import pytest

from harness.budget.record import AttemptRecord, BudgetRecord, StrategyBudget
from harness.fileio.codec import (
    TABLE_STYLE,
    Limit,
    LongInteger,
    RecordError,
    decode,
    decode_fields,
    encode,
    json_key,
)
from harness.plan import EnginePlan, Plan
from harness.results.checkpoint_reading import ReadingChoice
from harness.results.disk import DiskRead, ReadProbe, SharedDisk
from harness.results.record import (
    LAYOUT_VERSION,
    CacheRecord,
    CheckpointInfo,
    EngineRecord,
    ExportRecord,
    MachineInfo,
    ModelInfo,
    Phases,
    Reference,
    RepeatRecord,
    RunRecord,
    StrategyRecord,
)
from harness.scenario import BuildConfig, CheckpointConfig, ModelConfig, RunConfig, Scenario
from harness.scenario import Reference as ScenarioReference
from harness.units import GIB, MIB


def _positive(value: int) -> str | None:
    return None if value > 0 else f"expected a positive count, got {value}"


@dataclass(frozen=True)
class Inner:
    count: int
    size_bytes: int | None = None
    delta_bytes: int = field(default=0, metadata={"signed": True})


@dataclass(frozen=True)
class Outer:
    name: str
    inner: Inner
    items: tuple[Inner, ...]
    table: dict[str, float]
    free: dict[str, Any]
    path: Path | None
    added: int = field(default=7, metadata={"since": 2, "check": _positive})
    note: str = field(default="", metadata={"null_as": ""})
    layout: int = field(default=2, metadata={"since": 2, "version": True})


def _outer() -> dict[str, Any]:
    return {"layout": 2, "name": "x", "inner": {"count": 1, "size_bytes": None, "delta_bytes": -3},
            "items": [{"count": 2, "size_bytes": 10, "delta_bytes": 0}], "table": {"a": 1.5}, "free": {"k": [1]},
            "path": "/tmp/p", "added": 3, "note": "n"}


def _read(data: Any, version: int | None = None) -> Outer:
    return decode(Outer, data, source="f.json", version=version)


def test_round_trip_of_a_record_with_every_kind_of_field() -> None:
    record = _read(_outer())
    assert record == Outer("x", Inner(1, None, -3), (Inner(2, 10, 0),), {"a": 1.5}, {"k": [1]}, Path("/tmp/p"), 3,
                           "n", 2)
    assert encode(record) == _outer()
    assert list(encode(record))[0] == "layout", "the version key comes first"


def test_an_unknown_key_is_refused_naming_its_path() -> None:
    data = _outer()
    data["inner"]["cuont"] = 1
    with pytest.raises(RecordError, match=r"^f.json: inner: unknown key 'cuont'$"):
        _read(data)


def test_a_missing_key_is_refused_naming_its_path_and_how_many_more() -> None:
    data = _outer()
    del data["items"][0]["count"], data["items"][0]["size_bytes"]
    with pytest.raises(RecordError, match=r"^f.json: items\[0\]: missing key 'count' \(and 1 more\)$"):
        _read(data)


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d.update(name=5), "name: expected a string, got 5"),
    (lambda d: d["inner"].update(count="1"), 'inner.count: expected an integer, got "1"'),
    (lambda d: d["inner"].update(count=True), "inner.count: expected an integer, got true"),
    (lambda d: d["inner"].update(size_bytes=1.5), "inner.size_bytes: expected an integer or null, got 1.5"),
    (lambda d: d["table"].update(a=float("nan")), "table.a: expected a number, got NaN"),
    (lambda d: d.update(items={}), "items: expected a list, got {}"),
    (lambda d: d.update(inner=[]), "inner: expected an object, got []"),
    (lambda d: d.update(path=3), "path: expected a string or null, got 3"),
    (lambda d: d["inner"].update(count=-1), "inner.count: expected a value of at least 0, got -1"),
    (lambda d: d["inner"].update(size_bytes=2**53), "inner.size_bytes: 9007199254740992 bytes is out of range"),
    (lambda d: d["inner"].update(count=LongInteger(30)), "inner.count: an integer of 30 digits is out of range"),
    (lambda d: d.update(added=0), "added: expected a positive count, got 0"),
    (lambda d: d.update(layout=3), "layout: this harness reads layout versions 1 to 2, got 3"),
])
def test_a_wrong_value_is_refused_naming_its_nested_path(change: Any, message: str) -> None:
    data = json.loads(json.dumps(_outer()))
    change(data)
    with pytest.raises(RecordError) as caught:
        _read(data)
    assert str(caught.value).startswith(f"f.json: {message}"), caught.value


def test_null_reads_as_declared_and_a_signed_field_may_be_negative() -> None:
    data = _outer()
    data["note"] = None
    assert _read(data).note == ""
    assert _read(_outer()).inner.delta_bytes == -3


def test_a_since_field_is_absent_in_an_older_layout_and_required_in_its_own() -> None:
    old = _outer()
    del old["layout"], old["added"]
    record = _read(old)
    assert (record.layout, record.added) == (1, 7), "version 1 read: the field's default"
    assert encode(record)["layout"] == 2, "always written at the current layout"
    with pytest.raises(RecordError, match="unknown key 'added'"):
        _read({**old, "added": 3})
    with pytest.raises(RecordError, match=r"^f.json: <top level>: missing key 'added'$"):
        _read({**old, "layout": 2})


def test_a_misspelt_rule_is_a_mistake_of_the_class() -> None:
    @dataclass(frozen=True)
    class Wrong:
        value: int = field(default=0, metadata={"sinec": 2})

    with pytest.raises(TypeError, match="Wrong.value: unknown rule 'sinec'"):
        decode(Wrong, {"value": 1}, source="f.json")


# --------------------------------------------------------------------------- every record type

ENGINE = EngineRecord(0, 10, 0.5, 1.0, 100, 10, 90, None, 3, 2.0, 5, 80, 7, -4, 0.1, 0.2, 6)
EXPORT = ExportRecord(1.5, 12, 100, -5, 10, 20, 30, -2, 1)
CACHE = CacheRecord("cold", "dropped", True, None, True, 10, 0, 0, 10, 0.25, ("a note",))
REPEAT = RepeatRecord(1, "ok", None, 2.0, 1.0, 0.5, 100, 0)
STRATEGY = StrategyRecord(status="ok", note="n", host_peak_bytes=100, phases=Phases(0.0, 1.0, 1.0, 2.0, None, None),
                          samples=5, engines=(ENGINE,), excess_over_floor=-0.5, export=EXPORT, cache=CACHE,
                          repeats=(REPEAT,), drop_cache=False)
MACHINE = MachineInfo(2, GIB, None, "6.1", "host", "linux")
MODEL = ModelInfo("m", "synthetic", "", 4, 1000, 1000)
CHECKPOINT = CheckpointInfo("/data/m.safetensors", True, 0, 1100)
REFERENCE = Reference("elsewhere", 1.0, None, 2.5, "measured elsewhere")
RUN = RunRecord(scenario="s", name="smoke", description="d", created="2024-01-01T00:00:00", commit=None,
                machine=MACHINE, versions={"torch": "2.4", "cuda": None}, model=MODEL, checkpoint=CHECKPOINT,
                engines=1, engine_cap_bytes=10, largest_engine_bytes=10, backend="copy", device="cpu", cache="cold",
                release=True, memory_limit_bytes=None, references=(REFERENCE,),
                scenario_config={"name": "smoke", "run": {"repeats": 1, "sample_interval_ms": 10.0}},
                strategies={"map": STRATEGY},
                repeats=1, disk_reads=(DiskRead(0, 1100, 0.5, 2200.0, 0.4, "read", 0),),
                reading=ReadingChoice("madvise", False, "chosen: why", "set by the scenario"),
                shared_disk=(SharedDisk(1100, 10, 0.5, 0.75, 1.0),), round_orders=(("map",),))
ATTEMPT = AttemptRecord("unconstrained", GIB, True, -9, 1.0, 100, 0, None, 0.9, None, 0.5, 10, 0)
BUDGET = BudgetRecord("sweep", "s", "", "2024-01-01", "abc", MACHINE, {"torch": None}, "m", 1000, "/c", 1, 10, "copy",
                      "cpu", "v2", MIB, 1 << 32, 3.0, 60.0, 10.0,
                      {"map": StrategyBudget("ok", None, "map", "", 10, 5, 1, 2, 60.0, MIB, None, True, (1, 2),
                                             (ATTEMPT,))})
PLAN = Plan(scenario=Scenario(name="smoke", path=Path("/scenarios/smoke.toml"), strategies=("map",),
                              model=ModelConfig("spec", spec=Path("/specs/pi05.json"), trim=("a",)),
                              checkpoint=CheckpointConfig(Path("/c"), seed=3),
                              build=BuildConfig(engine_cap_mib=1.5, backend="copy"),
                              run=RunConfig(prefetch="off", repeats=2, memory_limit_gib=2.0),
                              references=(ScenarioReference("A40", host_peak_gib=1.0),)),
            name="smoke", model=MODEL, checkpoint=CHECKPOINT, checkpoint_files=("/c",), device="cpu",
            engine_cap_bytes=10, engines=(EnginePlan(0, ("a",), ("a.weight",), 10),), workdir="/w",
            reading=ReadingChoice(None, True, "set by the scenario", "chosen: a reason",
                                  ReadProbe(MIB, (0.5, 0.25), (0.5,), 1 << 16, (1.0,), (0.125,))))


def budget_as_earlier(record: BudgetRecord) -> dict[str, Any]:
    """``record`` encoded as a budget file of version 1 or 2 held it: no ``reading``, and no attempt keys of
    layout 20 (``job_ids``, ``node``, ``limit_enforcer``), since those versions are read at an earlier layout."""
    slurm = ("job_ids", "node", "limit_enforcer")
    data = {k: v for k, v in encode(record).items() if k != "reading"}
    data["strategies"] = {name: {**s, "attempts": [{k: v for k, v in a.items() if k not in slurm}
                                                  for a in s["attempts"]]}
                          for name, s in data["strategies"].items()}
    return data


@pytest.mark.parametrize("record", [ENGINE, EXPORT, CACHE, REPEAT, STRATEGY, Phases(1.0), MACHINE, MODEL, CHECKPOINT,
                                    REFERENCE, RUN, ATTEMPT, BUDGET, DiskRead(0, 1, 1.0, 1.0, 0.5, "read", 0),
                                    EnginePlan(0, (), ("w",), 1), ModelConfig(layers=1, width=8, vocab=4)],
                         ids=lambda r: type(r).__name__)
def test_every_record_type_reads_back_as_written(record: Any) -> None:
    data = json.loads(json.dumps(encode(record)))
    assert set(data) == {json_key(f) for f in fields(record) if "until" not in f.metadata}  # a dropped key: never
    assert decode(type(record), data, source="f.json", version=LAYOUT_VERSION) == record


@dataclass(frozen=True)
class Dropping:
    kept: dict[str, Any]
    old: int | None = field(default=None, metadata={"since": 2, "until": 3, "moved_to": "kept.now"})


def test_a_key_a_later_layout_dropped_reads_from_older_records_only_and_is_never_written() -> None:
    def read(data: dict[str, Any], version: int) -> Dropping:
        return decode(Dropping, data, source="f.json", version=version)

    assert read({"kept": {}}, 1) == Dropping({})  # before the layout that added it
    assert read({"kept": {}, "old": 5}, 3) == Dropping({}, 5)  # where nothing else holds it: the only value
    assert read({"kept": {"now": 5}, "old": 5}, 2) == Dropping({"now": 5})  # held there too: held once
    with pytest.raises(RecordError, match=r"^f.json: old: expected 5, the value kept.now records, got 6$"):
        read({"kept": {"now": 5}, "old": 6}, 3)
    with pytest.raises(RecordError, match=r"^f.json: <top level>: missing key 'old'$"):
        read({"kept": {"now": 5}}, 3)
    with pytest.raises(RecordError, match=r"^f.json: <top level>: unknown key 'old'$"):
        read({"kept": {"now": 5}, "old": 5}, 4)
    assert encode(Dropping({}, 5)) == {"kept": {}}


def test_a_field_renamed_in_code_keeps_its_files_key(tmp_path: Path) -> None:
    from harness.budget.mode import write_attempts_csv

    data = json.loads(json.dumps(encode(ATTEMPT)))
    assert data["compile_s"] == ATTEMPT.load_build_s == 0.5 and "load_build_s" not in data
    assert decode(AttemptRecord, data, source="budget.json", version=LAYOUT_VERSION) == ATTEMPT
    assert next(f for f in fields(AttemptRecord) if json_key(f) == "compile_s").name == "load_build_s"
    header = write_attempts_csv(tmp_path, BUDGET).read_text().splitlines()[0].split(",")
    assert header == ["strategy", "run", *data]  # the CSV's columns are the JSON's keys
    renamed = {("load_build_s" if k == "compile_s" else k): v for k, v in data.items()}
    with pytest.raises(RecordError, match=r"^budget.json: <top level>: unknown key 'load_build_s'$"):
        decode(AttemptRecord, renamed, source="budget.json", version=LAYOUT_VERSION)
    with pytest.raises(RecordError, match=r"^budget.json: compile_s: expected a value of at least 0, got -1$"):
        decode(AttemptRecord, {**data, "compile_s": -1}, source="budget.json", version=LAYOUT_VERSION)


def test_the_top_level_files_read_back_as_written() -> None:
    assert RunRecord.from_json(json.loads(json.dumps(RUN.to_json())), "summary.json") == RUN
    assert Plan.from_json(json.loads(json.dumps(PLAN.to_json())), "plan.json") == PLAN


def test_the_plan_carries_the_scenario_and_derives_its_settings_from_it() -> None:
    assert PLAN.compiler is False and PLAN.prefetch is None  # "off": no prefetch method
    assert PLAN.memory_limit_bytes == 2 * GIB
    assert PLAN.scenario.build.engine_cap_bytes == int(1.5 * MIB)
    assert PLAN.drop_cache is True  # from the plan's reading settings, not the scenario's "auto"
    on = dataclasses.replace(PLAN, scenario=dataclasses.replace(PLAN.scenario, run=RunConfig()),
                             reading=ReadingChoice("fadvise", False, "chosen: why", "chosen: why not"))
    assert (on.prefetch, on.drop_cache, on.memory_limit_bytes) == ("fadvise", False, None)
    with pytest.raises(RecordError, match=r"^plan.json: not a plan of version"):
        Plan.from_json({**PLAN.to_json(), "plan": 1}, "plan.json")


def test_rules_of_one_field_are_applied_where_the_field_is() -> None:
    data = json.loads(json.dumps(RUN.to_json()))
    data["strategies"] = {"Map": data["strategies"]["map"]}
    with pytest.raises(RecordError, match=r"^s: strategies.Map: expected letters a-z"):
        RunRecord.from_json(data, "s")
    data = json.loads(json.dumps(encode(BUDGET)))
    data["strategies"]["map"]["attempts"][0]["phase"] = "later"
    with pytest.raises(RecordError, match=r"^b: strategies.map.attempts\[0\].phase: expected one of unconstrained"):
        decode(BudgetRecord, data, source="b", version=LAYOUT_VERSION)


# --------------------------------------------------------------------------- the table style (a TOML scenario's)


class TableError(ValueError):
    """The error class a caller of the table style chooses."""


TABLE = replace(TABLE_STYLE, error=TableError)


@dataclass(frozen=True)
class Settings:
    label: str
    count: int = field(default=2, metadata={"limit": Limit(1, 10, integer=True)})
    rate: float | None = field(default=None, metadata={"limit": Limit(0, 5, low_open=True, unit="Hz")})
    names: tuple[str, ...] = ()
    extra: int | None = None


def _table_error(data: Any, **kwargs: Any) -> str:
    with pytest.raises(TableError) as info:
        decode(Settings, data, source="s.toml", where="t", style=TABLE, optional=True, **kwargs)
    return str(info.value)


def test_the_table_style_leaves_out_keys_with_a_default_and_checks_limits() -> None:
    read = decode(Settings, {"label": "x", "rate": 2}, source="s.toml", style=TABLE, optional=True)
    assert read == Settings("x", rate=2.0) and isinstance(read.rate, float)
    assert _table_error({"label": "x", "count": "8"}) == \
        's.toml: t.count: expected an integer >= 1 and <= 10, got "8" (str)'
    assert _table_error({"label": "x", "rate": 0}) == "s.toml: t.rate: expected a number > 0 and <= 5 (Hz), got 0 (int)"
    assert _table_error({"label": "x", "count": 2**900}).endswith("got an integer of about 271 digits (int)")
    assert _table_error([]) == "s.toml: t: expected a table, got [] (list)"


def test_the_table_style_reports_keys_at_the_key_in_order() -> None:
    assert _table_error({"label": "x", "cuont": 1, "zz": 2}) == \
        "s.toml: t.cuont: unknown key (did you mean 'count'?; known: count, extra, label, names, rate)"
    assert _table_error({"zz": 2}) == "s.toml: t.zz: unknown key (known: count, extra, label, names, rate)"
    assert _table_error({}) == "s.toml: t.label: required key is missing"
    assert _table_error({"label": "x"}, required=("extra",)) == "s.toml: t.extra: required key is missing"
    assert _table_error({"label": "x", "names": ["a", 3]}) == \
        's.toml: t.names: expected a list of strings, got ["a", 3] (list)'
    assert _table_error({"label": "x", "extra": "1"}) == 's.toml: t.extra: expected an integer, got "1" (str)'


def test_decode_fields_reads_some_fields_beside_keys_its_caller_reads() -> None:
    data = {"label": "x", "other": {"any": 1}}
    assert decode_fields(Settings, data, ("label", "count"), others=("other",), source="s.toml", style=TABLE,
                         optional=True) == {"label": "x", "count": 2}
    with pytest.raises(TableError, match=r"^s.toml: rate: unknown key \(known: count, label, other\)$"):
        decode_fields(Settings, {**data, "rate": 1}, ("label", "count"), others=("other",), source="s.toml",
                      style=TABLE, optional=True)


def test_a_record_still_needs_every_key_and_words_errors_as_a_record() -> None:
    with pytest.raises(RecordError, match=r"^r.json: <top level>: missing key 'count' \(and 3 more\)$"):
        decode(Settings, {"label": "x"}, source="r.json")
    with pytest.raises(RecordError, match=r"^r.json: rate: expected a number > 0 and <= 5 \(Hz\) or null, got 9$"):
        decode(Settings, {"label": "x", "count": 1, "rate": 9, "names": [], "extra": None}, source="r.json")
