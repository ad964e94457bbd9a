"""Whether this machine's kernel hands its free memory back to a host: what keeping read pages costs.

A virtual machine's balloon device may negotiate free page reporting (``VIRTIO_BALLOON_F_REPORTING``,
feature bit 5): the guest kernel then tells the host which of its free pages it may take back, and
the host stops backing them. The next write to such a page makes the host back it again, which is
slower than writing memory the guest freed a moment before (``benchmarks/fresh_memory.py`` times
both; the results' notes give the rates of the machines measured). A run that keeps a checkpoint's
pages in the page cache takes that many pages out of the kernel's reuse, so whatever it writes next
(engine files, buffers) lands on memory the host must back again. Without free page reporting a
freed page stays backed, and keeping read pages costs nothing.

Timing does not answer this reliably, so :func:`free_page_reporting` reads the balloon's negotiated
features instead of timing anything. The run's read probe does not see the cost, nor does
populating anonymous memory: the kernel hands out the pages it has not reported first (Linux puts
reported pages at the tail of its free lists), and after the run's own cold-cache drops those are
GiBs. Writes into a new file do show it, but a rule timed on them would cost seconds of every run.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["BALLOON_DEVICE_ID", "REPORTING_BIT", "VIRTIO_DEVICES", "free_page_reporting"]

VIRTIO_DEVICES = Path("/sys/bus/virtio/devices")
"""Where Linux lists virtio devices: each has a ``device`` id and the ``features`` the driver negotiated."""
BALLOON_DEVICE_ID = 0x0005
"""The virtio device id of a memory balloon."""
REPORTING_BIT = 5
"""``VIRTIO_BALLOON_F_REPORTING``: the balloon takes reports of free pages."""


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def free_page_reporting(devices: Path = VIRTIO_DEVICES) -> str | None:
    """The balloon device that reports this kernel's free pages to the host (its sysfs path), or ``None``.

    ``None`` where no virtio device lists a balloon (a machine that is not a virtual machine, or one
    without a balloon), where a balloon did not negotiate free page reporting, or where sysfs cannot
    be read. The ``features`` file holds one ``0``/``1`` per feature bit, bit 0 first.
    """
    try:
        entries = sorted(devices.iterdir())
    except OSError:
        return None
    for entry in entries:
        device = _read(entry / "device")
        features = _read(entry / "features")
        if device is None or features is None:
            continue
        try:
            device_id = int(device, 16)
        except ValueError:
            continue
        if device_id == BALLOON_DEVICE_ID and len(features) > REPORTING_BIT and features[REPORTING_BIT] == "1":
            return str(entry)
    return None
