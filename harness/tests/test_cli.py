"""The command line: every input a user can get wrong is one line ``error: ...`` and exit status 2.

Each case runs ``harness.cli.main`` in this process and checks the whole of stderr: one
line, naming the file and the key or path that is wrong. None of them runs a strategy.
The signal tests start a real parent process whose workers are stand-ins.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import torch

from harness.cli import main
from harness.results.names import budget_name, is_budget_name, reserved_problem
from harness.results.publish import MAX_NAME_CHARS
from harness.tests.fixtures import make_results
from harness.tests.tiny_scenario import tiny_scenario_text


def scenario(tmp_path: Path, text: str | None = None, replace: dict[str, str] | None = None) -> Path:
    """Write the scenario (default: the tiny scenario) with each ``replace`` key replaced by its value."""
    text = text if text is not None else tiny_scenario_text(tmp_path / "c.safetensors")
    for old, new in (replace or {}).items():
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / "s.toml"
    path.write_text(text)
    return path


def error_of(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run the command line; it must exit 2 and end with one line ``error: ...``; returns the message.

    Progress lines may come first (``[harness] ...``); the error is the last line and the only one.
    """
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.endswith("\n"), err
    lines = err.splitlines()
    assert lines[-1].startswith("error: ") and sum(line.startswith("error:") for line in lines) == 1, err
    assert all(not line.strip() or line.startswith(("[harness] ", "generating ")) for line in lines[:-1]), err
    return lines[-1][len("error: "):]


def run_error(capsys: pytest.CaptureFixture[str], path: Path, *extra: str) -> str:
    return error_of(capsys, "run", str(path), "--results", str(path.parent / "results"), *extra)


def test_engine_cap_that_rounds_to_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = scenario(tmp_path, replace={"engines = 2": "engine_cap_mib = 1e-9"})
    message = run_error(capsys, path)
    assert message.startswith(f"{path}: build.engine_cap_mib: 1e-09 MiB is less than one byte")


def test_more_engines_than_weight_units(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = scenario(tmp_path, replace={"engines = 2": "engines = 500"})
    message = run_error(capsys, path)
    assert message.startswith(f"{path}: build.engines: 500 engines asked for, but the model has only")
    assert not (tmp_path / "c.safetensors").exists(), "nothing is generated before the plan is known to work"


def test_zero_byte_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "empty.json"
    spec.write_text(json.dumps({"tensors": [{"name": "a.weight", "shape": [0], "dtype": "float32", "kind": "param"}]}))
    text = f'name = "z"\n[model]\nsource = "spec"\nspec = "{spec}"\n[build]\nengines = 1\ndevice = "cpu"\n'
    message = run_error(capsys, scenario(tmp_path, text))
    assert message.endswith("model: empty has no weight bytes (1 tensors, all empty): there is nothing to measure")


def test_non_utf8_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.toml"
    path.write_bytes(b'name = "caf\xe9"\n')
    assert run_error(capsys, path).startswith(f"{path}: not UTF-8 text")


def test_spec_that_is_not_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text("tensors = []")
    text = f'name = "z"\n[model]\nsource = "spec"\nspec = "{spec}"\n[build]\nengines = 1\n'
    message = run_error(capsys, scenario(tmp_path, text))
    assert message == f"{tmp_path / 's.toml'}: model.spec: {spec} is not JSON (line 1, column 1: Expecting value)"


def test_checkpoint_that_is_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "ckpt").mkdir()
    path = scenario(tmp_path, tiny_scenario_text(tmp_path / "ckpt"))
    message = run_error(capsys, path)
    assert message == (f"{path}: checkpoint.path: {tmp_path / 'ckpt'}: is a directory; "
                       "the harness reads and writes one .safetensors file (set checkpoint.max_shard_size to "
                       "generate shards into a folder)")


def test_checkpoint_not_written_by_the_harness(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors.torch import save_file

    foreign = tmp_path / "real.safetensors"
    save_file({"w": torch.zeros(2)}, str(foreign))
    path = scenario(tmp_path, tiny_scenario_text(foreign))
    message = run_error(capsys, path)
    assert message.startswith(f"{path}: checkpoint.path: {foreign}: exists and was not written by the harness")
    assert foreign.stat().st_size < 1000, "someone else's file is never replaced"


def test_checkpoint_that_does_not_exist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = scenario(tmp_path, replace={"generate = true": ""})
    message = run_error(capsys, path)
    assert message.startswith(f"{path}: checkpoint.path: {tmp_path / 'c.safetensors'}: no such file")
    assert not (tmp_path / "c.safetensors").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_cuda_without_one_fails_before_the_checkpoint_is_generated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = scenario(tmp_path, replace={'device = "cpu"': 'device = "cuda"'})
    message = run_error(capsys, path)
    assert message == f'{path}: build.device: device = "cuda" was asked for, but torch sees no CUDA device here'
    assert not (tmp_path / "c.safetensors").exists()


def test_tensorrt_backend_fails_before_anything_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = scenario(tmp_path, replace={"engines = 2": 'engines = 2\nbackend = "tensorrt"'})
    message = run_error(capsys, path)
    assert message.startswith(f"{path}: build.backend: backend 'tensorrt'") and "torch_tensorrt" in message
    assert not (tmp_path / "c.safetensors").exists(), "nothing may run before the backend is checked"


def test_results_root_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "results").write_text("")
    message = run_error(capsys, scenario(tmp_path))
    assert message == f"{tmp_path / 'results'}: the results root is a file, not a directory; pass --results DIR"
    assert not (tmp_path / "c.safetensors").exists()


def test_results_root_that_cannot_be_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if os.geteuid() == 0:  # root writes through permission bits; sysfs refuses a new directory to anyone
        root = Path("/sys/harness-results")
    else:
        root = tmp_path / "read-only"
        root.mkdir(mode=0o555)
    path = scenario(tmp_path)
    message = error_of(capsys, "run", str(path), "--results", str(root))
    assert message.startswith(f"{root}: cannot write results there (")
    assert not (tmp_path / "c.safetensors").exists()


@pytest.mark.parametrize("name", ["../x", "a/b", "Upper", ""])
def test_name_with_a_path_separator_or_other_characters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    message = run_error(capsys, scenario(tmp_path), "--name", name)
    assert message.startswith(f"--name {name!r}: expected letters a-z, digits, '_' or '-' only")
    assert not (tmp_path / "x").exists() and not (tmp_path / "results").exists()


BUDGET_RULE = "ends in '-budget', which only a budget sweep's results (<scenario>-budget) are named with"
COMPARISON_RULE = "holds '-vs-', which only the files of a comparison (<base>-vs-<new>.md) are named with"


@pytest.mark.parametrize(("name", "rule"), [("x-budget", BUDGET_RULE), ("a-vs-b", COMPARISON_RULE)])
def test_a_name_the_harness_derives_from_others_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, rule: str
) -> None:
    # a run named x-budget would replace a sweep of x's results; one named a-vs-b, the comparison of a and b
    named = scenario(tmp_path, replace={'name = "tiny"': f'name = "{name}"'})
    for command in ("run", "budget"):
        assert error_of(capsys, command, str(named), "--results", str(tmp_path / "results")) == (
            f"{named}: name: {name!r} {rule}")
    assert run_error(capsys, scenario(tmp_path), "--name", name) == f"--name: {name!r} {rule}; choose another"
    if name == "a-vs-b":  # a sweep's own name ends in -budget; a comparison's name it may not take
        assert error_of(capsys, "budget", str(scenario(tmp_path)), "--results", str(tmp_path / "results"),
                        "--name", name) == f"--name: {name!r} {rule}; choose another"
    assert not (tmp_path / "results").exists() and not (tmp_path / "c.safetensors").exists()


ONE_STRATEGY_RULE = ("holds '-budget-', which only a budget sweep's results of one strategy "
                     "(<scenario>-budget-<strategy>) are named with")


def test_a_run_refuses_the_name_of_a_strategy_swept_on_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # results/pi05-budget-stream holds the sweep of stream alone: a run so named would replace it
    name = "tiny-budget-stream"
    assert run_error(capsys, scenario(tmp_path), "--name", name) == (
        f"--name: {name!r} {ONE_STRATEGY_RULE}; choose another")
    named = scenario(tmp_path, replace={'name = "tiny"': f'name = "{name}"'})
    assert error_of(capsys, "run", str(named), "--results", str(tmp_path / "results")) == (
        f"{named}: name: {name!r} {ONE_STRATEGY_RULE}")
    assert not (tmp_path / "results").exists() and not (tmp_path / "c.safetensors").exists()


@pytest.mark.parametrize("name", ["tiny", "smoke"])
def test_a_sweep_refuses_a_runs_name(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    # a sweep named like a run would replace that run's results
    assert error_of(capsys, "budget", str(scenario(tmp_path)), "--results", str(tmp_path / "results"),
                    "--name", name) == (
        f"--name: {name!r} is a run's name: a budget sweep's results end in '-budget' or hold '-budget-' "
        "(<scenario>-budget, <scenario>-budget-<strategy>), so that they never replace a run's; choose another")
    assert not (tmp_path / "results").exists() and not (tmp_path / "c.safetensors").exists()


def test_runs_and_sweeps_take_names_of_their_own_kind_only() -> None:
    for name in ("pi05", "pi05-trim", "budget", "budgeted", "x-budgets", "budget-x"):
        assert not is_budget_name(name) and reserved_problem(name) is None
        assert reserved_problem(name, sweep=True) is not None
    for name in ("pi05-budget", "pi05-budget-stream", "pi05-budget-read_file"):
        assert is_budget_name(name) and reserved_problem(name, sweep=True) is None
        assert reserved_problem(name) is not None
    assert budget_name("pi05") == "pi05-budget" and is_budget_name(budget_name("x-budget-stream"))


def test_a_name_too_long_for_the_files_named_after_it_is_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "results").mkdir()  # an existing root: nothing is made in it
    name = "n" * (MAX_NAME_CHARS + 1)
    message = run_error(capsys, scenario(tmp_path), "--name", name)
    assert message == (f"--name {name[:40]!r}... ({len(name)} characters): at most {MAX_NAME_CHARS} characters (the "
                       f"files named after it, such as its staging directory .<name>.partial, must fit the 255 bytes "
                       f"of a file name)")
    assert list((tmp_path / "results").iterdir()) == [] and not (tmp_path / "c.safetensors").exists()
    message = run_error(capsys, scenario(tmp_path), "--name", "n" * 300)
    assert message.startswith("--name 'nnnn") and "(300 characters): at most" in message


def test_the_longest_name_runs_and_publishes_its_results_report_and_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.tests.test_publish import HANDS_IN_A_RESULT, stand_in
    from harness.tests.test_publish import scenario as four_engines

    name = "n" * MAX_NAME_CHARS
    source = make_results(tmp_path / "source", name=name, failed=None, strategies=("map",))
    stand_in(monkeypatch, HANDS_IN_A_RESULT, str(source), str(tmp_path), "-1")
    results = tmp_path / "results"
    assert main(["run", str(four_engines(tmp_path, "map")), "--results", str(results), "--name", name]) == 0
    assert (results / name / "summary.json").is_file() and (results / f"{name}.md").is_file()
    assert [p for p in results.iterdir() if p.suffix == ".png"], "its figures are written"


def test_results_that_are_an_empty_path_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path = scenario(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    for command in ("run", "budget"):
        message = error_of(capsys, command, str(path), "--results", "")
        assert message == ("--results '': expected a directory (an empty path would put the results and figures in "
                           "the current directory; pass --results . to mean it)")
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_results_with_a_part_too_long_for_a_file_name_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    part = "r" * 256
    message = error_of(capsys, "run", str(scenario(tmp_path)), "--results", str(tmp_path / part / "results"))
    assert message.startswith(f"--results {str(tmp_path / part / 'results')[:40]!r}... (")
    assert message.endswith(f"its part {part[:40]!r}... (256 characters) is longer than the 255 bytes of a file name")
    assert not (tmp_path / "c.safetensors").exists()


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002])
def test_published_results_have_the_mode_the_umask_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, umask: int
) -> None:
    from harness.tests.test_publish import RECORDS_A_FAILURE, stand_in

    stand_in(monkeypatch, RECORDS_A_FAILURE)
    results = tmp_path / "results"
    results.mkdir()
    before = os.umask(umask)
    try:
        assert main(["run", str(scenario(tmp_path)), "--results", str(results)]) == 1
    finally:
        os.umask(before)
    assert (results / "tiny").stat().st_mode & 0o7777 == 0o777 & ~umask


def test_plot_of_a_corrupt_results_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = make_results(tmp_path / "results")
    summary = directory / "summary.json"
    data = json.loads(summary.read_text())
    del data["strategies"]["map"]["wall_s"]
    summary.write_text(json.dumps(data))
    assert error_of(capsys, "plot", str(directory)) == f"{summary}: strategies.map: missing key 'wall_s'"
    summary.write_text("{")
    assert error_of(capsys, "plot", str(directory)).startswith(f"{summary}: not valid JSON (line 1")


def test_a_full_disk_is_an_error_and_earlier_results_stay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    earlier = make_results(tmp_path / "results", name="tiny")
    before = {p.name: p.read_bytes() for p in earlier.iterdir()}
    real = tempfile.mkstemp

    def no_space(*args: object, **kwargs: object) -> tuple[int, str]:
        if str(kwargs.get("prefix", "")).startswith(".summary.json"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(*args, **kwargs)  # type: ignore[call-overload, no-any-return]

    monkeypatch.setattr("harness.fileio.atomic.tempfile.mkstemp", no_space)
    monkeypatch.setattr("harness.run.worker_command", lambda *a: [sys.executable, "-c", "pass"])
    message = run_error(capsys, scenario(tmp_path))
    staged = tmp_path / "results" / ".tiny.partial" / "summary.json"
    assert message == f"{staged}: cannot write (No space left on device); any earlier file there is unchanged"
    assert {p.name: p.read_bytes() for p in earlier.iterdir()} == before


PARENT = """
import signal, sys, pathlib
import harness.run
signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as a terminal leaves it, whatever this test was started under
from harness.cli import main
tmp = pathlib.Path(sys.argv[1])
def worker(plan, strategy, out):
    code = "import os, time, pathlib; pathlib.Path(%r).write_text(str(os.getpid())); time.sleep(120)"
    return [sys.executable, "-c", code % str(tmp / "worker.pid")]
harness.run.worker_command = worker
sys.exit(main(["run", str(tmp / "s.toml"), "--results", str(tmp / "results")]))
"""


def _pid_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _start_parent(tmp_path: Path) -> tuple[subprocess.Popen[str], int]:
    scenario(tmp_path)
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(PARENT), str(tmp_path)],
                              stderr=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
    deadline = time.monotonic() + 120
    while not (tmp_path / "worker.pid").exists() or not (tmp_path / "worker.pid").read_text():
        assert parent.poll() is None, parent.communicate()[1]
        assert time.monotonic() < deadline, "the worker never started"
        time.sleep(0.1)
    return parent, int((tmp_path / "worker.pid").read_text())


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL])
def test_stopping_the_parent_ends_its_worker(tmp_path: Path, signum: int) -> None:
    earlier = make_results(tmp_path / "results", name="tiny")
    before = (earlier / "summary.json").read_bytes()
    parent, worker = _start_parent(tmp_path)
    parent.send_signal(signum)
    _, err = parent.communicate(timeout=60)
    if signum != signal.SIGKILL:
        assert parent.returncode == 128 + signum, err
        last = err.strip().splitlines()[-1]
        name = signal.Signals(signum).name
        assert last.startswith(f"error: interrupted by {name}; the running strategy's process was stopped (map); ")
        assert "results/tiny is unchanged" in last
    deadline = time.monotonic() + 10
    while _pid_alive(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _pid_alive(worker), "the worker outlived its parent"
    assert (earlier / "summary.json").read_bytes() == before
