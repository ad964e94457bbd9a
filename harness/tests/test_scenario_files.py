"""Paths that are there but are not regular files are refused before anything opens them.

Opening a FIFO for reading blocks until a writer comes, so a checkpoint path (or a scenario,
or a spec) that is a FIFO would hang the harness at plan time. Each case runs in a thread
with a deadline, so that a regression fails instead of hanging; a reader left blocked is
released by opening the FIFO for writing.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.cli import main
from harness.models import ModelError, SyntheticTransformer, load_spec
from harness.models.checkpoints import CheckpointError, ensure_checkpoint
from harness.plan import make_plan
from harness.scenario import BuildConfig, CheckpointConfig, ModelConfig, Scenario, ScenarioError, load_scenario
from harness.tests.tiny_scenario import tiny_scenario_text

DEADLINE_S = 30.0



def _release(fifo: Path) -> None:
    """Let a reader blocked opening ``fifo`` go on (it reads end of file)."""
    with contextlib.suppress(OSError):  # ENXIO: nobody is reading
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def within(fifo: Path, call: Callable[[], Any]) -> BaseException | None:
    """Run ``call`` in a thread; it must end within the deadline. Returns what it raised (None if nothing)."""
    outcome: dict[str, BaseException | None] = {"raised": None}

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # handed to the test
            outcome["raised"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(DEADLINE_S)
    blocked = thread.is_alive()
    while thread.is_alive():
        _release(fifo)
        thread.join(0.1)
    assert not blocked, f"blocked for {DEADLINE_S:.0f} s on {fifo}: it was opened"
    return outcome["raised"]


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "c.safetensors"
    os.mkfifo(path)
    yield path
    _release(path)


def _scenario_file(tmp_path: Path, checkpoint: Path, generate: bool = False) -> Path:
    path = tmp_path / "s.toml"
    path.write_text(tiny_scenario_text(checkpoint, {"name = \"tiny\"": "name = \"t\"",
                                                "generate = true": f"generate = {str(generate).lower()}"}))
    return path


FIFO_TEXT = "is a named pipe (FIFO), not a regular file; the harness reads and writes one .safetensors file"


@pytest.mark.parametrize("generate", [False, True])
def test_a_checkpoint_path_that_is_a_fifo_is_refused_when_the_scenario_loads(
    tmp_path: Path, fifo: Path, generate: bool
) -> None:
    path = _scenario_file(tmp_path, fifo, generate)
    raised = within(fifo, lambda: load_scenario(path))
    assert isinstance(raised, ScenarioError), raised
    assert str(raised) == f"{path}: checkpoint.path: {fifo}: {FIFO_TEXT}"


def test_the_command_line_says_so_in_one_line(
    tmp_path: Path, fifo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _scenario_file(tmp_path, fifo, generate=True)
    status: list[int] = []
    assert within(fifo, lambda: status.append(main(["run", str(path), "--results", str(tmp_path / "r")]))) is None
    assert status == [2]
    assert capsys.readouterr().err == f"error: {path}: checkpoint.path: {fifo}: {FIFO_TEXT}\n"
    assert fifo.is_fifo() and not (tmp_path / "r").exists()


def test_a_scenario_built_in_code_with_a_fifo_checkpoint_is_refused_by_the_plan(tmp_path: Path, fifo: Path) -> None:
    scenario = Scenario(name="t", model=ModelConfig(source="synthetic", layers=1, width=64, heads=4, vocab=64),
                        checkpoint=CheckpointConfig(path=fifo, generate=True), build=BuildConfig(engines=2,
                                                                                                 device="cpu"))
    raised = within(fifo, lambda: make_plan(scenario, name="t", workdir=tmp_path / "engines"))
    assert isinstance(raised, ScenarioError), raised
    assert str(raised) == f"scenario 't': checkpoint.path: {fifo}: {FIFO_TEXT}"


def test_generating_refuses_a_fifo_without_opening_it(fifo: Path) -> None:
    model = SyntheticTransformer(layers=1, width=64, vocab=64, heads=4)
    raised = within(fifo, lambda: ensure_checkpoint(model, fifo, 0, progress=False))
    assert isinstance(raised, CheckpointError), raised
    assert str(raised) == f"{fifo}: {FIFO_TEXT}"
    assert fifo.is_fifo(), "left as it was"


def test_a_socket_or_a_device_is_refused_too(tmp_path: Path) -> None:
    sock_path = tmp_path / "c.sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_path))
        message = str(within(sock_path, lambda: load_scenario(_scenario_file(tmp_path, sock_path))))
        assert message.endswith(f"checkpoint.path: {sock_path}: is a socket, not a regular file; the harness reads "
                                "and writes one .safetensors file")
    message = str(within(tmp_path, lambda: load_scenario(_scenario_file(tmp_path, Path("/dev/zero"), True))))
    assert message.endswith("checkpoint.path: /dev/zero: is a character device, not a regular file; the harness "
                            "reads and writes one .safetensors file")


def test_a_scenario_file_that_is_a_fifo_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    os.mkfifo(path)
    raised = within(path, lambda: load_scenario(path))
    assert isinstance(raised, ScenarioError), raised
    assert str(raised) == f"{path}: is a named pipe (FIFO), not a regular file; a scenario is a TOML file"


def test_a_spec_that_is_a_fifo_is_refused(tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    os.mkfifo(spec)
    path = tmp_path / "s.toml"
    path.write_text(f'name = "t"\n[model]\nsource = "spec"\nspec = "{spec}"\n[build]\nengines = 1\n')
    raised = within(spec, lambda: load_scenario(path))
    assert isinstance(raised, ScenarioError), raised
    assert str(raised) == f"{path}: model.spec: {spec} is a named pipe (FIFO), not a regular file"
    raised = within(spec, lambda: load_spec(spec))
    assert isinstance(raised, ModelError), raised
    assert "is not a regular file" in str(raised)
