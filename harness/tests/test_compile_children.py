"""The compiler's subprocesses are measured apart from this process, by summed RSS and by summed PSS."""

from __future__ import annotations

import subprocess
import sys

from harness.engines.compile.children import ChildPeak
from harness.units import MIB

# A child that holds 64 MiB of its own (touched) memory for half a second.
HOLD = "import time; b = bytearray(64 << 20); time.sleep(0.5)"
# A child that touches 64 MiB, then forks two children that share those pages with it (copy on write), all three
# alive for a second.
SHARE = """
import os, time
b = bytearray(64 << 20)
b[::4096] = b"\\x01" * (len(b) // 4096)
kids = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        time.sleep(1.0)
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
"""


def test_a_child_holding_memory_is_seen_with_its_name() -> None:
    with ChildPeak(interval_s=0.01) as peak:
        subprocess.run([sys.executable, "-c", HOLD], check=True)
    assert peak.samples > 5
    assert peak.peak_bytes >= 64 * MIB and peak.pss_peak_bytes >= 64 * MIB  # its own: counted whole by both
    assert peak.largest_bytes >= 64 * MIB
    assert peak.largest_name.startswith("python")


def test_no_child_no_memory() -> None:
    with ChildPeak(interval_s=0.01) as peak:
        sum(range(10_000))
    assert peak.peak_bytes == 0 and peak.pss_peak_bytes == 0 and peak.largest_name == ""


def test_pages_the_processes_share_count_once_in_their_summed_pss() -> None:
    with ChildPeak(interval_s=0.01) as peak:
        subprocess.run([sys.executable, "-c", SHARE], check=True)
    shared = 64 * MIB
    assert peak.peak_bytes >= 3 * shared, "summed RSS counts the shared pages once per process"
    assert shared <= peak.pss_peak_bytes < 2 * shared, "summed PSS counts them once across the three"
    assert peak.pss_peak_bytes < peak.peak_bytes
