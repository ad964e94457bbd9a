"""The command line: ``python -m harness run SCENARIO`` and ``python -m harness plot RESULTS_DIR``.

Exit status: 0 when everything ran, 1 when a strategy failed (its reason is in the
results), 2 for an error the user can fix (a :class:`~harness.errors.HarnessError`,
printed as one line ``error: <message>``, or a bad command line), 128 + the signal's
number when SIGINT or SIGTERM stopped a run.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from harness.errors import HarnessError

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness", description="Memory benchmarks of loading strategies.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{run,plot}")
    run = commands.add_parser("run", help="run every strategy of a scenario, write results and figures",
                              description="Run every strategy of a scenario; write results/<name>/ and its figures.")
    run.add_argument("scenario", type=Path, help="a scenario file, e.g. scenarios/smoke.toml")
    run.add_argument("--name", help="name of the results: results/<name>/ (default: the scenario's name)")
    run.add_argument("--results", type=Path, default=Path("results"), help="results root (default: results)")
    plot = commands.add_parser("plot", help="re-render the figures and the report from saved results",
                               description="Re-render the figures and the markdown report of a results directory.")
    plot.add_argument("results_dir", type=Path, help="a results directory holding summary.json")
    plot.add_argument("--out", type=Path, default=None, help="where to write (default: its parent)")
    plot.add_argument("--notes-checked", action="store_true",
                      help="the hand-written notes (<name>.notes.md) were re-read: stamp them with these figures")
    return parser


def _run(args: argparse.Namespace) -> int:
    from harness.run import run_scenario
    from harness.scenario import load_scenario

    record = run_scenario(load_scenario(args.scenario), name=args.name, results=args.results)
    return 1 if any(not s.ok for s in record.strategies.values()) else 0


def _plot(args: argparse.Namespace) -> int:
    from harness.report import render_all

    rendered = render_all(args.results_dir, args.out, notes_checked=args.notes_checked)
    for path in rendered.paths:
        print(path)
    if rendered.stale_notes:
        print(f"warning: check the notes on {rendered.paths[-1].stem}: {'; '.join(rendered.stale_notes)}; "
              "re-read them, then pass --notes-checked", file=sys.stderr)
    return 0


def one_line(error: BaseException) -> str:
    """An error's message on one line (a multi-line message's lines joined with ``; ``)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return "; ".join(lines) or type(error).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    args = _parser().parse_args(argv)
    from harness.run import RunInterrupted

    try:
        return _run(args) if args.command == "run" else _plot(args)
    except RunInterrupted as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 128 + exc.signum
    except HarnessError as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
