"""The settings a run's or a sweep's plan resolved, in words: one sentence, the same in both reports.

:func:`settings_line` says the prefetch and drop-cache settings of the strategies that map
(:class:`~harness.results.disk.SpeedChoice`, as :func:`harness.plan.make_plan` resolved them), how prefetch asks,
and why each; the run's report (:mod:`harness.report.markdown`) and the budget sweep's
(:mod:`harness.report.budget`) both write it, so a run and a sweep of one scenario say their settings alike.
"""

from __future__ import annotations

from harness.results.disk import SpeedChoice
from harness.units import MIB

__all__ = ["settings_line"]


def settings_line(speed: SpeedChoice) -> str:
    """``- **settings of the strategies that map**: prefetch `madvise` one engine ahead, ... (why); drop_cache off
    (why).``: a markdown list item."""
    prefetch = f"`{speed.prefetch}` one engine ahead" if speed.prefetch else "off"
    if speed.prefetch and speed.prefetch_sizing_why is not None:
        prefetch += (f", {speed.prefetch_readers} reader(s) asking at once in requests of "
                     f"{speed.prefetch_request_bytes / MIB:g} MiB ({speed.prefetch_sizing_why})")
    return (f"- **settings of the strategies that map**: prefetch {prefetch} ({speed.prefetch_why}); "
            f"drop_cache {'on' if speed.drop_cache else 'off'} ({speed.drop_cache_why}).")
