"""What a strategy's process prints while it runs: labelled numbers on stderr, through tqdm.

* :func:`phase_ticker`: during a long step with no steps of its own (a whole checkpoint
  being loaded), a line that says how long it has run and the process's RSS, refreshed
  every second: ``[load] loading for 00:12, RSS 6.10 GiB``;
* :func:`engine_bar`: engines built and their bytes:
  ``[map] 3.20 of 8.71 GiB of engine weights built, engines 5/16 |███   | [00:12<00:20]``.

The parent passes this output through unchanged, so bars update in place.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator

from tqdm import tqdm

from harness.measure.procfs import read_status

__all__ = ["EngineBar", "engine_bar", "phase_ticker"]

GIB = 1 << 30


@contextlib.contextmanager
def phase_ticker(prefix: str, what: str, every_s: float = 1.0) -> Iterator[None]:
    """Show ``[prefix] what for <elapsed>, RSS <GiB>`` until the block ends (then one final line)."""
    bar = tqdm(total=None, desc=f"[{prefix}] {what} for", bar_format="{desc} {elapsed}{postfix}", file=sys.stderr,
               mininterval=every_s, leave=True)
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(every_s):
            bar.set_postfix_str(f"RSS {read_status().rss_bytes / GIB:.2f} GiB", refresh=True)

    thread = threading.Thread(target=tick, name="progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        bar.set_postfix_str(f"RSS {read_status().rss_bytes / GIB:.2f} GiB", refresh=False)
        bar.close()


class EngineBar:
    """A bar of engines built, labelled with the bytes built so far out of the model's."""

    def __init__(self, prefix: str, engines: int, total_bytes: int) -> None:
        self.prefix, self.total_bytes, self.built_bytes = prefix, total_bytes, 0
        self._bar = tqdm(total=engines, desc=self._label(), unit="engine", file=sys.stderr, mininterval=1.0,
                         leave=True, bar_format="{desc}, engines {n_fmt}/{total_fmt} |{bar}| [{elapsed}<{remaining}]")

    def _label(self) -> str:
        return (f"[{self.prefix}] {self.built_bytes / GIB:.2f} of {self.total_bytes / GIB:.2f} GiB "
                "of engine weights built")

    def built(self, nbytes: int) -> None:
        """One more engine of ``nbytes`` is built."""
        self.built_bytes += nbytes
        self._bar.set_description_str(self._label(), refresh=False)
        self._bar.update(1)

    def close(self) -> None:
        self._bar.close()


def engine_bar(prefix: str, engines: int, total_bytes: int) -> EngineBar:
    """An :class:`EngineBar` for ``engines`` engines reading ``total_bytes`` in all."""
    return EngineBar(prefix, engines, total_bytes)
