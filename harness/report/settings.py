"""The settings a run's or a sweep's plan resolved, in words: one sentence, the same in both reports.

:func:`settings_line` says the prefetch and drop-cache settings of the strategies that map
(:class:`~harness.results.checkpoint_reading.ReadingChoice`, as :func:`harness.plan.make_plan` resolved them), how
prefetch asks, and why each; the run's report (:mod:`harness.report.markdown`) and the budget sweep's
(:mod:`harness.report.budget`) both write it, so a run and a sweep of one scenario say their settings alike.
"""

from __future__ import annotations

from harness.results.checkpoint_reading import ReadingChoice
from harness.units import MIB

__all__ = ["settings_line"]


def settings_line(choice: ReadingChoice) -> str:
    """``- **settings of the strategies that map**: prefetch `madvise` one engine ahead, ... (why); drop_cache off
    (why).``: a markdown list item."""
    prefetch = f"`{choice.prefetch}` one engine ahead" if choice.prefetch else "off"
    if choice.prefetch and choice.prefetch_sizing_why is not None:
        prefetch += (f", {choice.prefetch_readers} reader(s) asking at once in requests of "
                     f"{choice.prefetch_request_bytes / MIB:g} MiB ({choice.prefetch_sizing_why})")
    return (f"- **settings of the strategies that map**: prefetch {prefetch} ({choice.prefetch_why}); "
            f"drop_cache {'on' if choice.drop_cache else 'off'} ({choice.drop_cache_why}).")
