"""The compiler's subprocesses are measured apart from this process."""

from __future__ import annotations

import subprocess
import sys

from harness.engines.compile.children import ChildPeak

# A child that holds 64 MiB of its own (touched) memory for half a second.
HOLD = "import time; b = bytearray(64 << 20); time.sleep(0.5)"


def test_a_child_holding_memory_is_seen_with_its_name() -> None:
    with ChildPeak(interval_s=0.01) as peak:
        subprocess.run([sys.executable, "-c", HOLD], check=True)
    assert peak.samples > 5
    assert peak.peak_bytes >= 64 << 20
    assert peak.largest_bytes >= 64 << 20
    assert peak.largest_name.startswith("python")


def test_no_child_no_memory() -> None:
    with ChildPeak(interval_s=0.01) as peak:
        sum(range(10_000))
    assert peak.peak_bytes == 0 and peak.largest_name == ""
