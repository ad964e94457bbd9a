"""`python -m weightmap`: every bad input is one line and exit status 2; Ctrl-C is one line and 130."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from weightmap.cli import main

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "src.safetensors"
    save_file({"w": torch.ones(4, 4), "n": torch.arange(3)}, str(path))
    return path


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    status = main(list(argv))
    return status, capsys.readouterr().err


@pytest.mark.parametrize("dtype", ["int8", "bool", "complex64", "", "notadtype", "torch.float16"])
def test_a_dtype_that_is_not_floating_point_is_one_line_and_exit_2(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], dtype: str
) -> None:
    status, err = run_main(capsys, "convert", str(source), str(tmp_path / "out.safetensors"), "--dtype", dtype)
    assert status == 2 and err.count("\n") == 1 and err.startswith(f"error: --dtype {dtype!r}: ")
    assert not (tmp_path / "out.safetensors").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["convert", "only-one-argument"],
        ["nonsense"],
        ["inspect"],
        ["convert", "a", "b", "--max-shard-size", "lots"],
    ],
)
def test_usage_errors_are_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    status, err = run_main(capsys, *argv)
    assert status == 2 and err.count("\n") == 1 and err.startswith("error: "), err


def test_an_error_prints_no_progress_line_before_it(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "a-directory"
    directory.mkdir()
    status, err = run_main(capsys, "convert", str(source), str(directory))
    assert status == 2 and err.count("\n") == 1 and err.startswith(f"error: {directory}: is a directory")


@pytest.mark.parametrize("destination", ["fifo", "/dev/null", "missing/out.safetensors"])
def test_a_destination_that_cannot_be_written_is_the_error_line_alone(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], destination: str
) -> None:
    if destination == "fifo":
        os.mkfifo(tmp_path / "fifo")
    target = destination if destination.startswith("/") else str(tmp_path / destination)
    status, err = run_main(capsys, "convert", str(source), target)
    assert status == 2 and err.count("\n") == 1 and err.startswith(f"error: {target}: "), repr(err)
    assert "\r" not in err and "writing" not in err


def test_help_is_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--help"], ["convert", "--help"], ["inspect", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
        out = capsys.readouterr().out
        assert "python -m weightmap" in out and "``" not in out, out


def test_the_summary_counts_a_file_whatever_its_name(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, err = run_main(capsys, "convert", str(source), str(tmp_path / "weights.bin"))
    assert status == 0 and f"wrote {tmp_path / 'weights.bin'}: 1 file, " in err, err


@pytest.mark.parametrize("call", ["sys.exit(3)", "os._exit(0)", "raise SystemExit"])
@pytest.mark.parametrize("where", ["factory", "import"])
def test_model_code_that_ends_the_process_is_an_error(
    source: Path, tmp_path: Path, call: str, where: str
) -> None:
    models = tmp_path / "exiting.py"
    body = f"    {call}\n    return None\n" if where == "factory" else "    return None\n"
    prelude = f"{call}\n" if where == "import" else ""
    models.write_text(f"import os, sys\n{prelude}def build():\n{body}")
    done = subprocess.run(
        [sys.executable, "-m", "weightmap", "inspect", str(source), "--model", f"{models}:build"],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"error: --model {models}:build: the model's code "
                                                                   "called ")


def test_sigint_is_one_line_and_exit_130_and_leaves_the_destination(tmp_path: Path) -> None:
    source = tmp_path / "big.safetensors"
    save_file({f"t{i}": torch.zeros(1024, 1024) for i in range(48)}, str(source))  # 192 MiB
    out = tmp_path / "out"
    code = (
        "import os, signal, sys, time\n"
        # as an interactive shell starts a command: a job put in the background by a non-interactive shell (a CI
        # runner's `cmd &`) starts with SIGINT ignored, which Python then leaves ignored
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from weightmap import cli, convert\n"
        "original = convert._Writer._written\n"
        "def slow(self, nbytes):\n"
        "    original(self, nbytes)\n"
        "    print('written', flush=True)\n"
        "    time.sleep(0.5)\n"
        "convert._Writer._written = slow\n"
        f"argv = ['convert', {str(source)!r}, {str(out)!r}, '--dtype', 'bf16', '--max-shard-size', '32MB']\n"
        "sys.exit(cli.main(argv))\n"
    )
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert process.stdout is not None
    assert process.stdout.readline() == "written\n"  # a conversion under way
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert err.splitlines()[-1] == "interrupted" and "Traceback" not in err
    assert not out.exists()  # nothing of the conversion is left


def test_ctrl_c_while_importing_is_one_line_and_exit_130() -> None:
    # Ctrl-C before main() runs (importing torch takes seconds): the import itself is interrupted.
    code = (
        "import runpy, sys, types\n"
        "cli = types.ModuleType('weightmap.cli')\n"
        "def interrupted(name):\n"
        "    raise KeyboardInterrupt\n"
        "cli.__getattr__ = interrupted\n"
        "sys.modules['weightmap.cli'] = cli\n"
        "runpy.run_module('weightmap', run_name='__main__', alter_sys=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 130 and done.stderr == "interrupted\n", done.stderr
