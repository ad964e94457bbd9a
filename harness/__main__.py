"""``python -m harness run SCENARIO`` runs a scenario; ``python -m harness plot RESULTS_DIR`` re-renders it."""

from __future__ import annotations

import sys

from harness.errors import HarnessError

USAGE = """usage: python -m harness {run,plot} ...

  run SCENARIO [--name NAME] [--results DIR]   run every strategy of a scenario, write results and figures
  plot RESULTS_DIR [--out DIR]                 re-render the figures and the report from saved results
"""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0 if args else 2
    command, rest = args[0], args[1:]
    try:
        if command == "run":
            from harness.run import main_run

            return main_run(rest)
        if command == "plot":
            from harness.plots import main_plot

            return main_plot(rest)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"unknown command {command!r}\n{USAGE}", file=sys.stderr, end="")
    return 2


if __name__ == "__main__":
    sys.exit(main())
