"""The plan is the run's single resolution: made once, with its read probe, read-ceiling sweep and prefetch
sizing, written once, read by every worker as it was written, and stated alike by the run's and the sweep's
reports; its records are held at the results layout, a counter apart from the plan's own version.

Checkpoints and engine files go under temporary directories, never under the repository's ``data/``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from pathlib import Path

import pytest

from harness.budget.record import BUDGET_FILE, BUDGET_VERSION, read_budget, write_budget
from harness.fileio.codec import encode
from harness.plan import PLAN_VERSION, Plan, read_plan
from harness.report import render_staged
from harness.report.budget import budget_markdown
from harness.report.markdown import reading_observation
from harness.report.settings import settings_line
from harness.results.checkpoint_reading import ReadingChoice
from harness.results.reading import load_results
from harness.results.record import LAYOUT_VERSION, PLAN, RecordError
from harness.run import run_scenario
from harness.tests.test_codec import BUDGET, budget_as_earlier
from harness.tests.test_codec import PLAN as A_PLAN
from harness.tests.test_run import tiny_scenario
from harness.units import MIB
from harness.worker import worker_command

SEEN = """
import hashlib, json, os, sys
plan, log = sys.argv[1], sys.argv[-1]
st = os.stat(plan)
with open(log, "a") as f:
    f.write(json.dumps([st.st_ino, st.st_mtime_ns, hashlib.sha256(open(plan, "rb").read()).hexdigest()]) + "\\n")
os.execv(sys.executable, [sys.executable, "-m", "harness.worker", *sys.argv[1:-1]])
"""


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[list[object]], Path]:
    """A cold run with a read-ceiling sweep and a warm-up round, each worker noting the plan file it was handed."""
    tmp = tmp_path_factory.mktemp("once")
    log = tmp / "seen.jsonl"

    def noting(plan: Path, strategy: str, out: Path) -> list[str]:
        real = worker_command(plan, strategy, out)
        return [sys.executable, "-c", SEEN, *real[3:], str(log)]

    scenario = tiny_scenario(tmp, "map")
    scenario = dataclasses.replace(scenario, run=dataclasses.replace(scenario.run, warmup=1, read_ceiling=True))
    assert scenario.run.cache == "cold"
    run_scenario(scenario, results=tmp / "results", command=noting, workdir=tmp / "engines", render=render_staged)
    return [json.loads(line) for line in log.read_text().splitlines()], tmp / "results" / "tiny"


def test_plan_json_is_written_once_and_every_worker_reads_it_as_written(
        watched: tuple[list[list[object]], Path]) -> None:
    seen, out = watched
    assert len(seen) == 2  # the warm-up round's worker and the measured one
    assert seen[0] == seen[1], "plan.json changed between the warm-up round and the measured round"
    published = out / PLAN
    assert hashlib.sha256(published.read_bytes()).hexdigest() == seen[0][2]


def test_the_plan_sizes_prefetch_to_its_ceiling_sweep_and_the_record_states_it_once(
        watched: tuple[list[list[object]], Path]) -> None:
    _, out = watched
    plan = read_plan(out / PLAN)
    assert plan.read_ceiling and plan.read_ceiling_error is None
    assert plan.reading.prefetch == "madvise" and plan.reading.prefetch_sizing_why is not None  # sized before any round
    record = load_results(out).record
    assert record.reading == plan.reading and record.read_ceiling == plan.read_ceiling
    report = (out.parent / "tiny.md").read_text()
    assert settings_line(plan.reading) in report


def test_a_plan_holds_its_records_at_the_results_layout() -> None:
    data = json.loads(json.dumps(A_PLAN.to_json()))
    assert (data["plan"], data["layout"]) == (PLAN_VERSION, LAYOUT_VERSION)
    assert Plan.from_json(data, "plan.json") == A_PLAN
    # a key the results layout requires of a reading choice is required in a plan too, never read as its default
    lacking = json.loads(json.dumps(data))
    del lacking["reading"]["prefetch_readers"]
    with pytest.raises(RecordError, match=r"^plan.json: reading: missing key 'prefetch_readers'$"):
        Plan.from_json(lacking, "plan.json")
    for wrong in ({**data, "layout": LAYOUT_VERSION - 1}, {k: v for k, v in data.items() if k != "layout"}):
        with pytest.raises(RecordError, match=rf"^plan.json: layout: expected {LAYOUT_VERSION}, "):
            Plan.from_json(wrong, "plan.json")


READING = ReadingChoice("madvise", False, "chosen: regions asked for ahead came in fast", "chosen: off: no reporting",
                        prefetch_readers=2, prefetch_request_bytes=8 * MIB,
                        prefetch_sizing_why="the read-ceiling sweep's fastest point")


def test_a_budget_record_holds_the_plans_settings_at_the_results_layout(tmp_path: Path) -> None:
    record = dataclasses.replace(BUDGET, checkpoint=str(tmp_path / "c"), reading=READING)
    write_budget(tmp_path, record)
    data = json.loads((tmp_path / BUDGET_FILE).read_text())
    assert (data["budget"], data["layout"]) == (BUDGET_VERSION, LAYOUT_VERSION)
    assert read_budget(tmp_path) == record
    del data["reading"]["prefetch_readers"]
    (tmp_path / BUDGET_FILE).write_text(json.dumps(data))
    with pytest.raises(RecordError, match=r"reading: missing key 'prefetch_readers'$"):
        read_budget(tmp_path)
    earlier = {"budget": 2, **budget_as_earlier(record)}
    (tmp_path / BUDGET_FILE).write_text(json.dumps(earlier))
    assert read_budget(tmp_path) == dataclasses.replace(record, reading=None)  # version 2 recorded no settings
    version_3 = {"budget": 3, "layout": 20,
                 **{("speed" if k == "reading" else k): v for k, v in encode(record).items()}}
    (tmp_path / BUDGET_FILE).write_text(json.dumps(version_3))
    assert read_budget(tmp_path) == record  # version 3 held the settings as ``speed``


def test_the_budget_report_states_the_settings_in_the_run_reports_words() -> None:
    budget = budget_markdown(dataclasses.replace(BUDGET, reading=READING), [], None)
    line = settings_line(READING)
    assert line in budget.splitlines()
    assert "2 reader(s) asking at once in requests of 8 MiB" in line

    class _Run:  # what reading_observation reads of a run's results
        class record:  # noqa: N801
            reading = READING

    assert reading_observation(_Run())[0] == line  # type: ignore[arg-type]
    assert budget_markdown(BUDGET, [], None).count("settings of the strategies that map") == 0  # none recorded

