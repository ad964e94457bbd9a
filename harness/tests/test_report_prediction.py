"""The prediction beside each measurement in the reports: the run report's columns and detail lines, the finding
named where a measurement lies more than 10 % of the model from its prediction, ``no prediction (why)`` where the
record lacks what the rules need, and the budget report's predicted minimum and search counts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from harness.budget.record import read_budget
from harness.predict.recorded import inputs_of_run
from harness.predict.rules import predict_strategy
from harness.report.budget import budget_markdown
from harness.report.markdown import render_report
from harness.report.prediction import GPU_PREDICTION_NOTE
from harness.report.table import columns, strategy_cells
from harness.report.text import format_percent, gib_decimals
from harness.results import labels
from harness.results.reading import Results, load_results
from harness.tests.committed import committed_copy
from harness.tests.fixtures import make_results
from harness.units import DASH, format_gib


def _fabricated(tmp_path: Path) -> Results:
    return load_results(make_results(tmp_path, failed="load_file"))


def _with_map_peak(run: Results, peak: int) -> Results:
    record = run.record
    maps = dataclasses.replace(record.strategies["map"], build_peak_bytes=peak, host_peak_bytes=peak)
    return dataclasses.replace(run, record=dataclasses.replace(record, strategies={**record.strategies,
                                                                                    "map": maps}))


def _map_findings(report: str) -> list[str]:
    return [line for line in report.splitlines() if line.startswith("- **map**'s") and "a finding, not a failure"
            in line]


def _map_rule(run: Results) -> int:
    """map's build-phase peak by its rule, from the record: its baseline RSS + the largest engine."""
    s = run.record.strategies["map"]
    assert s.baseline_rss_bytes is not None
    return s.baseline_rss_bytes + max(e.weight_bytes for e in s.engines)


def test_the_table_shows_the_predicted_build_peak_and_its_error_beside_the_measured(tmp_path: Path) -> None:
    run = _fabricated(tmp_path)
    model, d = run.record.model.bytes, gib_decimals(run.record.model.bytes)
    predicted = _map_rule(run)
    measured = predicted + model // 40  # 2.5 % of the model above it
    run = _with_map_peak(run, measured)
    cells = strategy_cells(run)["map"]
    assert cells[labels.PREDICTED_BUILD_PEAK] == format_gib(predicted, d)
    assert cells[labels.PREDICTION_ERROR] == format_percent((predicted - measured) / model) == "−2.5%"
    report = render_report(run)
    assert f"build-phase host peak {format_gib(predicted, d)} (measured {format_gib(measured, d)}, −2.5% of the " \
           "model)" in report
    assert not _map_findings(report)  # within 10 % of the model
    # a strategy that did not finish has no comparison: its prediction is what it would have needed, from the sizes
    # and baseline of one that finished
    needed = predict_strategy(dataclasses.replace(inputs_of_run(run, "map"), strategies=("load_file",)), "load_file")
    assert needed.build_peak_bytes is not None
    cells = strategy_cells(run)["load_file"]
    assert (cells[labels.PREDICTED_BUILD_PEAK], cells[labels.PREDICTION_ERROR]) == (
        format_gib(needed.build_peak_bytes, d), DASH)
    assert f"what it would have needed to finish: build-phase host peak {format_gib(needed.build_peak_bytes, d)}" \
           in report


def test_a_measurement_more_than_ten_percent_of_the_model_from_its_prediction_is_a_finding(tmp_path: Path) -> None:
    run = _fabricated(tmp_path)
    model, d = run.record.model.bytes, gib_decimals(run.record.model.bytes)
    predicted = _map_rule(run)
    run = _with_map_peak(run, predicted + model // 5)  # 20 % above
    report = render_report(run)
    findings = _map_findings(report)
    assert len(findings) == 1, findings  # the whole-run peak is the same pair: not said twice
    assert findings[0].startswith("- **map**'s build-phase host peak") and "20.0% of the model) above its " \
        f"prediction of {format_gib(predicted, d)}" in findings[0]


def test_a_record_without_a_baseline_says_no_prediction_and_why(tmp_path: Path) -> None:
    run = _fabricated(tmp_path)
    record = run.record
    bare = {n: dataclasses.replace(s, baseline_rss_bytes=None) for n, s in record.strategies.items()}
    run = dataclasses.replace(run, record=dataclasses.replace(record, strategies=bare))
    assert strategy_cells(run)["map"][labels.PREDICTED_BUILD_PEAK] == "no prediction"
    assert f"no prediction (layout {record.layout} records no baseline RSS)" in render_report(run)


def test_the_budget_report_shows_the_predicted_minimum_and_both_search_counts(tmp_path: Path) -> None:
    """results/smoke-budget's report counts its own search runs and what the sweep's arithmetic makes from the other
    start on its verdicts (from the prediction where the sweep predates starting from one, from the baseline where it
    started from the prediction: a rerun of ``make budget-smoke`` does); map's prediction is its baseline's
    anonymous memory + the reclaim floor (its rule, the constant this sweep measured), beside the minimum."""
    from harness.predict.rules import RECLAIM_FLOOR_BYTES

    directory = committed_copy(["results/smoke-budget"], tmp_path) / "results" / "smoke-budget"
    record = read_budget(directory)
    m = record.strategies["map"]
    assert m.baseline_anon_bytes is not None and m.minimum_bytes is not None
    predicted = m.baseline_anon_bytes + RECLAIM_FLOOR_BYTES
    d = gib_decimals(record.model_bytes)
    text = budget_markdown(record, [], None, directory)
    row = next(line for line in text.splitlines() if line.startswith("| map ("))
    error = format_percent((predicted - m.minimum_bytes) / record.model_bytes)
    assert f"| {format_gib(m.minimum_bytes, d)} | {format_gib(predicted, d)} ({error}) |" in row
    searched = sum(1 for a in m.attempts if a.phase not in ("unconstrained", "extra"))
    line = next(line for line in text.splitlines() if line.startswith("- map: "))
    if any(a.phase == "predicted" for a in m.attempts):
        assert line.startswith(f"- map: {searched} search runs, starting from the predicted minimum "
                               f"({format_gib(predicted, d)}); without a prediction the sweep would have made ")
    else:
        assert line.startswith(f"- map: {searched} search runs, without a prediction (the sweep predates starting "
                               f"from one); from the predicted minimum ({format_gib(predicted, d)}) the sweep would "
                               "have made ")
    assert "no prediction (rendered without its results directory)" in budget_markdown(record, [], None)


def test_compare_shows_each_runs_prediction_beside_its_measurement(tmp_path: Path) -> None:
    from harness.report.comparison import comparison_markdown
    from harness.results.comparison import compare_results

    base = _fabricated(tmp_path / "base")
    new = _with_map_peak(_fabricated(tmp_path / "new"), _map_rule(base) + base.record.model.bytes // 40)
    d = gib_decimals(base.record.model.bytes)
    text = comparison_markdown(compare_results(base, new))
    row = next(line for line in text.splitlines() if line.startswith("| map |") and "−2.5%" in line)
    measured = base.record.strategies["map"].build_peak_bytes
    assert measured is not None
    base_error = format_percent((_map_rule(base) - measured) / base.record.model.bytes)
    assert row == f"| map | {format_gib(_map_rule(base), d)} | {base_error} | {format_gib(_map_rule(new), d)} | −2.5% |"


def test_a_gpu_run_shows_the_predicted_gpu_peak_and_its_error_and_a_cpu_run_does_not(tmp_path: Path) -> None:
    """The copy backend's engines stay on the GPU, so its rule predicts the model above the GPU baseline taken once
    the CUDA context exists, as the run measures it: the error is the measured peak's distance from the model."""
    gpu = load_results(make_results(tmp_path / "gpu", device="cuda"))
    model, d = gpu.record.model.bytes, gib_decimals(gpu.record.model.bytes)
    record = gpu.record
    maps = dataclasses.replace(record.strategies["map"], gpu_peak_bytes=model + model // 40)  # 2.5 % above
    gpu = dataclasses.replace(gpu, record=dataclasses.replace(record, strategies={**record.strategies, "map": maps}))
    headers = [c.header for c in columns(gpu)]
    at = headers.index(labels.WHOLE_RUN_GPU_PEAK)
    assert headers[at + 1:at + 3] == [labels.PREDICTED_GPU_PEAK, labels.GPU_PREDICTION_ERROR]
    cells = strategy_cells(gpu)
    assert (cells["map"][labels.PREDICTED_GPU_PEAK], cells["map"][labels.GPU_PREDICTION_ERROR]) == (
        format_gib(model, d), "−2.5%")
    measured = gpu.record.strategies["load"].gpu_peak_bytes
    assert measured is not None
    assert cells["load"][labels.GPU_PREDICTION_ERROR] == format_percent((model - measured) / model)
    # a strategy that did not finish: what it would have needed, no error
    assert (cells["load_file"][labels.PREDICTED_GPU_PEAK], cells["load_file"][labels.GPU_PREDICTION_ERROR]) == (
        format_gib(model, d), DASH)
    report = render_report(gpu)
    assert f"whole-run GPU peak {format_gib(model, d)} (measured {format_gib(model + model // 40, d)}, −2.5% of " \
           "the model)" in report
    assert GPU_PREDICTION_NOTE in report

    cpu = load_results(make_results(tmp_path / "cpu"))
    headers = [c.header for c in columns(cpu)]
    assert labels.PREDICTED_BUILD_PEAK in headers
    assert labels.PREDICTED_GPU_PEAK not in headers and labels.GPU_PREDICTION_ERROR not in headers
    assert GPU_PREDICTION_NOTE not in render_report(cpu)


def test_a_gpu_strategy_no_gpu_rule_covers_shows_no_prediction_and_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A loader whose copies go to the GPU has a host prediction but no GPU one: the GPU cells say so, as the host's
    do for a strategy no rule covers, and its detail line says why."""
    from harness.predict import rules

    gpu = load_results(make_results(tmp_path, device="cuda"))
    monkeypatch.setattr(rules, "TO_DEVICE", ("map",))
    cells = strategy_cells(gpu)["map"]
    assert cells[labels.PREDICTED_BUILD_PEAK] != "no prediction"
    assert (cells[labels.PREDICTED_GPU_PEAK], cells[labels.GPU_PREDICTION_ERROR]) == ("no prediction", DASH)
    assert f"whole-run GPU peak: no prediction ({rules.NO_GPU_RULE})" in render_report(gpu)


def test_notes_are_not_checked_against_the_gpu_prediction(tmp_path: Path) -> None:
    """Notes stamped with a GPU run's measured figures stay checked: a prediction is derived from the rules, which
    may change without the run changing, so its columns are left out of the stamp."""
    from harness.report.notes import Notes, figure_changes

    gpu = load_results(make_results(tmp_path, device="cuda"))
    predicted = (labels.PREDICTED_BUILD_PEAK, labels.PREDICTION_ERROR, labels.PREDICTED_GPU_PEAK,
                 labels.GPU_PREDICTION_ERROR)
    measured = {name: {k: v for k, v in cells.items() if k not in ("strategy", "status", *predicted)}
                for name, cells in strategy_cells(gpu).items()}
    assert figure_changes(Notes(tmp_path / "smoke.notes.md", "notes", measured), gpu) == []
