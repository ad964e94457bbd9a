"""The matrix of ``python -m harness sweep``: its scenarios and its summary linking each results directory."""

from __future__ import annotations

from pathlib import Path

from harness.budget.record import read_budget
from harness.cluster.matrix import MatrixRow, variants, write_summary
from harness.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]


def test_one_scenario_over_several_engine_counts_is_one_scenario_each() -> None:
    smoke = load_scenario(ROOT / "scenarios" / "smoke.toml")
    made = variants([smoke], [4, 16])
    assert [(s.name, s.build.engines) for s in made] == [("smoke-e4", 4), ("smoke-e16", 16)]
    assert variants([smoke]) == [smoke]


def test_the_summary_links_each_results_directory_and_names_each_failure(tmp_path: Path) -> None:
    record = read_budget(ROOT / "results" / "smoke-budget")
    rows = [MatrixRow("smoke", tmp_path / "smoke-budget", record),
            MatrixRow("pi05", None, None, "sbatch refused job map-0: invalid partition")]
    text = write_summary(tmp_path, "m", rows, "slurm").read_text()
    assert "[smoke-budget](smoke-budget/)" in text
    assert "| pi05 | - | failed: sbatch refused job map-0: invalid partition |" in text
    minimum = record.strategies["load"].minimum_bytes
    assert minimum is not None and f"{minimum / 2**20:.0f} MiB" in text
