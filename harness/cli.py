"""The command line: ``python -m harness run SCENARIO``, ``python -m harness budget SCENARIO`` (or, for a model of
one's own without a scenario file, ``--model SPEC --checkpoint PATH ...`` in place of SCENARIO:
:mod:`harness.cli_scenario`; a run publishes the scenario it ran as ``results/<name>/scenario.toml``),
``python -m harness plot RESULTS_DIR``, ``python -m harness compare BASE NEW`` and
``python -m harness schema [scenario|layouts]`` (:mod:`harness.schema`: a scenario file's keys, the results
layouts' history) and ``python -m harness predict SCENARIO`` (:mod:`harness.predict.command`).

Exit status: 0 when everything ran, 1 when a strategy failed (its reason is in the
results) or, for ``compare --fail-on-regression PCT``, when a regression beyond the noise is larger
than PCT percent (with ``--memory-only``, a memory figure's, or a strategy failing in NEW or missing
from it), 2 for an error the user can fix (a :class:`~harness.errors.HarnessError`,
printed as one line ``error: <message>``, or a bad command line), 128 + the signal's
number when SIGINT, SIGTERM or SIGHUP stopped a run or a budget sweep.

The layers below know nothing of the report: ``run`` renders through what it is handed here
(:func:`harness.report.render_staged`, so that results and figures go in place together), and
``budget`` renders after the sweep is published (:func:`harness.report.budget.render_budget`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from harness.cli_scenario import add_model_flags, scenario_from_flags
from harness.errors import HarnessError
from harness.scenario_cluster import EXECUTORS
from harness.units import GIB, MIB

if TYPE_CHECKING:
    from harness.budget.record import BudgetRecord
    from harness.results.record import RunRecord
    from harness.scenario import Scenario
    from harness.watch import Supervisor

__all__ = ["main"]


def _results_root(text: str) -> Path:
    """``--results TEXT`` as a path; an empty one is refused in one line (``Path('')`` is ``.``: the results
    and figures would go into the current directory unasked)."""
    if text == "":
        raise HarnessError("--results '': expected a directory (an empty path would put the results and figures "
                           "in the current directory; pass --results . to mean it)")
    return Path(text)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness", description="Memory benchmarks of loading strategies.")
    commands = parser.add_subparsers(dest="command", required=True,
                                     metavar="{run,budget,sweep,plot,compare,schema,predict}")
    run = commands.add_parser("run", help="run every strategy of a scenario, write results and figures",
                              description="Run every strategy of a scenario; write results/<name>/ and its figures.")
    run.add_argument("scenario", type=Path, nargs="?", help="a scenario file, e.g. scenarios/smoke.toml")
    run.add_argument("--name", help="name of the results: results/<name>/ (default: the scenario's name; with "
                                    "--model, the factory function's name or the config's model_type)")
    run.add_argument("--results", default="results", help="results root (default: results)")
    add_model_flags(run)
    run.add_argument("--executor", choices=EXECUTORS, default="local",
                     help="local: each worker a process here; slurm: each worker run (each strategy's run of each "
                          "round, warm-up rounds included) a Slurm job with the scenario's [cluster] table and "
                          "--mem of its run.memory_limit_gib where set, one at a time (default: local)")
    budget = commands.add_parser(
        "budget", help="find each strategy's smallest memory limit under a kernel memory cgroup",
        description="Sweep every strategy of a scenario for the smallest memory-cgroup limit it completes "
                    "under; write results/<name>/ (default <scenario>-budget) and its report and figure.")
    budget.add_argument("scenario", type=Path, nargs="?", help="a scenario file, e.g. scenarios/smoke.toml")
    budget.add_argument("--name", help="name of the results (default: <scenario name>-budget)")
    budget.add_argument("--results", default="results", help="results root (default: results)")
    budget.add_argument("--precision-mib", type=float, default=None,
                        help="stop bisecting when the bracket is this narrow (default: 2%% of the model, "
                             "at least 64 MiB)")
    budget.add_argument("--timeout-factor", type=float, default=4.0,
                        help="an attempt that runs longer than this times the unconstrained wall time has not "
                             "completed (default: 4)")
    budget.add_argument("--at", action="append", default=[], metavar="STRATEGY=GIB",
                        help="run STRATEGY once unconstrained and once under GIB GiB instead of sweeping it "
                             "(repeatable); for strategies whose attempts take minutes")
    add_model_flags(budget)
    budget.add_argument("--executor", choices=EXECUTORS, default="local",
                        help="local: each attempt a process here; slurm: each attempt a Slurm job whose --mem is "
                             "its limit (the scenario's [cluster] table; SLURM_CONF as for sbatch), the strategies "
                             "swept at once (default: local)")
    sweep = commands.add_parser(
        "sweep", help="budget sweeps (or runs) of several scenarios (or one over several engine counts), one summary",
        description="Run `budget` (with --mode run, `run`) for each SCENARIO (with --engines, for each engine count "
                    "of each), each into results/<scenario>-budget/ (results/<scenario>/), and write "
                    "results/<name>.sweep.md linking them all.")
    sweep.add_argument("scenarios", type=Path, nargs="+", metavar="SCENARIO", help="scenario files")
    sweep.add_argument("--name", default="matrix", help="name of the summary: results/<name>.sweep.md")
    sweep.add_argument("--results", default="results", help="results root (default: results)")
    sweep.add_argument("--engines", default="", help="comma-separated engine counts, e.g. 4,8,16 (default: each "
                                                     "scenario's own)")
    sweep.add_argument("--timeout-factor", type=float, default=4.0, help="as for budget (default: 4)")
    sweep.add_argument("--executor", choices=EXECUTORS, default="local",
                       help="as for budget or run (default: local)")
    sweep.add_argument("--mode", choices=MODES, default="budget",
                       help="budget: each scenario's budget sweep; run: each scenario run (default: budget)")
    plot = commands.add_parser("plot", help="re-render the figures and the report from saved results",
                               description="Re-render the figures and the markdown report of a results directory.")
    plot.add_argument("results_dir", type=Path, help="a results directory holding summary.json")
    plot.add_argument("--out", type=Path, default=None, help="where to write (default: its parent)")
    plot.add_argument("--notes-checked", action="store_true",
                      help="the hand-written notes (<name>.notes.md) were re-read: stamp them with these figures")
    compare = commands.add_parser(
        "compare", help="compare two results directories: what moved in memory and time, beyond the noise",
        description="Compare NEW with BASE, strategy by strategy: each memory figure's delta and each time's "
                    "ratio NEW / BASE with an interval over the rounds, marked only when beyond the noise. "
                    "Prints a markdown table; with --out, writes <base>-vs-<new>.md and .png.")
    compare.add_argument("base", type=Path, help="the results directory to compare against (BASE)")
    compare.add_argument("new", type=Path, help="the results directory compared (NEW)")
    compare.add_argument("--scenario", action="store_true",
                         help="compare runs of different scenarios (the report says they differ)")
    compare.add_argument("--out", type=Path, default=None,
                         help="write <base>-vs-<new>.md and <base>-vs-<new>.png here instead of printing")
    compare.add_argument("--fail-on-regression", type=float, default=None, metavar="PCT",
                         help="exit 1 when a regression beyond the noise is larger than PCT percent (memory: "
                              "of the model; time: of BASE's median; a strategy failing in NEW or missing from "
                              "it: always)")
    compare.add_argument("--memory-only", action="store_true",
                         help="with --fail-on-regression: only memory figures (and a strategy failing in NEW or "
                              "missing from it) fail; times are reported, never gated (a machine shared with "
                              "other work moves every time of a run together)")
    schema = commands.add_parser(
        "schema", help="print a scenario file's keys and the results layouts, from the dataclasses' fields",
        description="Print every key of a scenario file (what it takes, its default) and, for each results "
                    "layout, the keys it added to summary.json; both read from the fields the loader and the "
                    "codec read.")
    schema.add_argument("what", nargs="?", choices=SCHEMAS, help="only this listing (default: both)")
    from harness.predict.command import add_parser as add_predict

    add_predict(commands)
    return parser


MODES = ("budget", "run")
"""What ``python -m harness sweep --mode`` runs for each scenario."""

SCHEMAS = ("scenario", "layouts")
"""What ``python -m harness schema`` prints, in this order."""


def _say(prefix: str, message: str) -> None:
    print(f"[{prefix}] {message}", file=sys.stderr, flush=True)


def _run(args: argparse.Namespace) -> int:
    """Run the scenario; its report and figures are rendered from the staged results and go in place with them."""
    from harness.fileio.atomic import FileBatch
    from harness.report import Rendered, render_staged
    from harness.run import run_scenario
    from harness.scenario import load_scenario
    from harness.scenario_file import write_scenario_file

    rendered: list[Rendered] = []
    results = _results_root(args.results)  # before the scenario is read: nothing runs with a bad one
    flags = scenario_from_flags(args)
    scenario = flags or load_scenario(args.scenario)

    def render(staging: Path, published_as: Path, batch: FileBatch) -> None:
        if flags is not None:  # published with the results: ``harness run <it>`` reruns the same scenario
            write_scenario_file(flags, staging)
        rendered.append(render_staged(staging, published_as, batch))

    record = run_scenario(scenario, name=None if flags else args.name, results=results, render=render,
                          supervisor=_supervisor(args.executor, scenario))
    for done in rendered:
        for path in done.paths:
            _say("harness", f"wrote {path}")
        if done.stale_notes:
            _say("harness", f"the notes on {record.name} were checked against other figures; see {done.paths[-1]}")
    return 1 if any(not s.ok for s in record.strategies.values()) else 0


def _supervisor(executor: str, scenario: Scenario) -> Supervisor:
    """How each worker of a run is run: a process here, or (``slurm``) a Slurm job with the scenario's settings."""
    from harness.watch import watch_here

    if executor == "slurm":
        from harness.cluster.runs import SlurmRuns

        return SlurmRuns(scenario.cluster).watch
    return watch_here


def _at_limit(text: str) -> tuple[str, int]:
    """``--at STRATEGY=GIB`` as (strategy, bytes); one ``error:`` line for anything else."""
    from harness.budget.mode import AT_LIMIT_GIB

    name, sep, value = text.partition("=")
    try:
        gib = float(value)
    except ValueError:
        gib = float("nan")
    if not sep or not name or not AT_LIMIT_GIB.accepts(gib):
        raise HarnessError(f"--at {text}: expected STRATEGY=GIB (GIB: {AT_LIMIT_GIB.expected()})")
    return name, int(gib * GIB)


def _budget(args: argparse.Namespace) -> int:
    from harness.budget.mode import PRECISION_MIB, TIMEOUT_FACTOR, run_budget
    from harness.predict.recorded import predicted_minimum
    from harness.report.budget import render_budget
    from harness.scenario import load_scenario

    results = _results_root(args.results)
    for flag, value, limit in (("--precision-mib", args.precision_mib, PRECISION_MIB),
                               ("--timeout-factor", args.timeout_factor, TIMEOUT_FACTOR)):
        if value is not None and not limit.accepts(value):  # nan, inf: before anything runs
            raise HarnessError(f"{flag} {value:g}: {limit.expected()}")
    precision = None if args.precision_mib is None else int(args.precision_mib * MIB)
    at = dict(_at_limit(text) for text in args.at)
    flags = scenario_from_flags(args)
    scenario = flags or load_scenario(args.scenario)
    unknown = sorted(set(at) - set(scenario.strategies))
    if unknown:
        raise HarnessError(f"--at {unknown[0]}: not a strategy of {args.scenario or scenario.source} (it runs "
                           f"{', '.join(scenario.strategies)})")
    jobs = None
    if args.executor == "slurm":
        from harness.cluster.executor import SlurmAttempts

        jobs = SlurmAttempts(scenario.cluster)
    record = run_budget(scenario, name=None if flags else args.name, results=results,
                        precision_bytes=precision, timeout_factor=args.timeout_factor, at=at, jobs=jobs,
                        start_of=predicted_minimum)
    for path in render_budget(results / record.name):
        _say("budget", f"wrote {path}")
    return 1 if any(not s.ok for s in record.strategies.values()) else 0


def _sweep(args: argparse.Namespace) -> int:
    from harness.cluster.matrix import MatrixRow, variants, write_summary
    from harness.scenario import load_scenario
    from harness.stopping import RunInterrupted

    results = _results_root(args.results)
    try:
        engines = [int(n) for n in args.engines.split(",") if n.strip()]
    except ValueError:
        raise HarnessError(f"--engines {args.engines!r}: expected comma-separated whole numbers") from None
    one = _sweep_budget if args.mode == "budget" else _sweep_run
    rows = []
    for scenario in variants([load_scenario(p) for p in args.scenarios], engines):
        try:
            record = one(scenario, results, args)
            rows.append(MatrixRow(scenario.name, results / record.name, record))
        except RunInterrupted:
            raise
        except HarnessError as exc:  # recorded, and the next scenario runs
            rows.append(MatrixRow(scenario.name, None, None, one_line(exc)))
        path = write_summary(results, args.name, rows, args.executor, args.mode)
    _say("sweep", f"wrote {path}")
    return 0 if all(r.record is not None and all(s.ok for s in r.record.strategies.values()) for r in rows) else 1


def _sweep_budget(scenario: Scenario, results: Path, args: argparse.Namespace) -> BudgetRecord:
    """One scenario of ``sweep --mode budget``: its budget sweep into ``<results>/<scenario>-budget/``, rendered."""
    from harness.budget.mode import run_budget
    from harness.cluster.executor import SlurmAttempts
    from harness.predict.recorded import predicted_minimum
    from harness.report.budget import render_budget
    from harness.results.names import budget_name

    jobs = SlurmAttempts(scenario.cluster) if args.executor == "slurm" else None
    record = run_budget(scenario, name=budget_name(scenario.name), results=results,
                        timeout_factor=args.timeout_factor, jobs=jobs, start_of=predicted_minimum)
    render_budget(results / record.name)
    return record


def _sweep_run(scenario: Scenario, results: Path, args: argparse.Namespace) -> RunRecord:
    """One scenario of ``sweep --mode run``: its run into ``<results>/<scenario>/``, with its report and figures."""
    from harness.report import render_staged
    from harness.run import run_scenario

    return run_scenario(scenario, results=results, render=render_staged,
                        supervisor=_supervisor(args.executor, scenario))


def _plot(args: argparse.Namespace) -> int:
    from harness.budget.record import BUDGET_FILE
    from harness.report import render_all

    if os.path.lexists(args.results_dir / BUDGET_FILE):  # whatever it is: its reader says what is wrong with it
        from harness.report.budget import render_budget

        for path in render_budget(args.results_dir, args.out):
            print(path)
        return 0

    rendered = render_all(args.results_dir, args.out, notes_checked=args.notes_checked)
    for path in rendered.paths:
        print(path)
    if rendered.stale_notes:
        print(f"warning: check the notes on {rendered.paths[-1].stem}: {'; '.join(rendered.stale_notes)}; "
              "re-read them, then pass --notes-checked", file=sys.stderr)
    return 0


def _compare(args: argparse.Namespace) -> int:
    from harness.report.comparison import UNTIMED, comparison_markdown, write_comparison
    from harness.results.comparison import compare_results
    from harness.results.reading import load_results

    pct = args.fail_on_regression
    if pct is not None and not (pct >= 0 and pct != float("inf")):
        raise HarnessError(f"--fail-on-regression {pct:g}: expected a percentage of at least 0")
    if args.memory_only and pct is None:
        raise HarnessError("--memory-only: says which regressions fail; give it with --fail-on-regression PCT")
    comparison = compare_results(load_results(args.base), load_results(args.new), across_scenarios=args.scenario)
    if args.out is None:
        print(comparison_markdown(comparison), end="")
    else:
        for path in write_comparison(comparison, args.out):
            print(path)
    if pct is None:
        return 0
    regressions = comparison.regressions()
    gated = [r for r in regressions if not (args.memory_only and r.time)]
    beyond = [r for r in gated if r.exceeds(pct)]
    for regression in beyond:
        amounts = regression.amounts()
        print(f"regression: {regression.describe()} (more than {pct:g}%)" + (f": {amounts}" if amounts else ""),
              file=sys.stderr)
    if args.memory_only:
        slower = len(regressions) - len(gated)
        if slower:
            print(f"note: not gated (--memory-only): {slower} slow-down{'s' if slower != 1 else ''} of time beyond "
                  "the noise", file=sys.stderr)
        return 1 if beyond else 0
    untimed = comparison.untimed()
    if untimed:
        which = "any strategy" if len(untimed) == len(comparison.strategies) else ", ".join(untimed)
        print(f"note: {UNTIMED.format(which=which)}", file=sys.stderr)
    return 1 if beyond else 0


def _schema(args: argparse.Namespace) -> int:
    from harness.schema import layout_history, scenario_schema

    listings: dict[str, tuple[str, Callable[[], str]]] = {
        "scenario": ("A scenario file's keys: key, what it takes [default]", scenario_schema),
        "layouts": ("The keys each results layout added to summary.json", layout_history)}
    shown = [args.what] if args.what else list(SCHEMAS)
    print("\n".join(f"{listings[w][0]}:\n\n{listings[w][1]()}" for w in shown), end="")
    return 0


def _predict(args: argparse.Namespace) -> int:
    from harness.predict.command import run as run_predict

    return run_predict(args)


def one_line(error: BaseException) -> str:
    """An error's message on one line (a multi-line message's lines joined with ``; ``)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return "; ".join(lines) or type(error).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    args = _parser().parse_args(argv)
    from harness.stopping import RunInterrupted

    try:
        return {"run": _run, "budget": _budget, "sweep": _sweep, "plot": _plot, "compare": _compare,
                "schema": _schema, "predict": _predict}[args.command](args)
    except RunInterrupted as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 128 + exc.signum
    except HarnessError as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
