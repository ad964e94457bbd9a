"""Whether this machine's kernel hands its free memory back to a host: what keeping read pages costs.

A virtual machine's balloon device may negotiate free page reporting (``VIRTIO_BALLOON_F_REPORTING``,
feature bit 5): the guest kernel then tells the host which of its free pages it may take back, and
the host stops backing them. The next write to such a page makes the host back it again. Measured
on this project's 2-core VM with ``benchmarks/fresh_memory.py`` (512 MiB, three rounds): ``write()``
into a new file after a few quiet seconds 0.30 to 0.40 GB/s, against 3.9 to 4.1 GB/s right after the
previous such file was dropped; populating anonymous memory (``MAP_POPULATE``) 0.3 to 0.5 GB/s
against 2 to 3.5 GB/s in rounds on a quiet machine, and no gap in rounds right after GiBs were freed.
A run that keeps a checkpoint's pages in the page cache takes that many pages out of the kernel's
reuse, so whatever it writes next (engine files, buffers) lands on memory the host must back
again. What that costs a whole build depends on what ran before it: with the strategies' order
changing from round to round, ``map_keep_cache``'s median wall there was 1.3x ``map``'s in one run
and 0.86x in the next, the rounds overlapping in both (``results/pi05``); 2x in runs that kept one
order of strategies in every round.

The H200 host this project measures on (a Firecracker VM, 16 cores) lists no balloon among its
virtio devices, and the same benchmark there found no gap (populating 3.3 GB/s fresh against 2.8
recycled, ``write()`` 3.55 against 3.62): keeping read pages cost nothing, and ``map`` with
``drop_cache`` off built as fast as ``map_keep_cache`` (``results/pi05-h200``), where with it on it
had been slower in every round.

The run's read probe does not see this, nor does populating anonymous memory reliably: the kernel
hands out the pages it has not reported first (Linux puts reported pages at the tail of its free
lists), and after the run's own cold-cache drops those are several GiB. On that VM, populating 256
MiB after freeing 4 GiB of page cache ran at 0.9 to 2.3 GB/s however long it waited (up to 8 s), and
the read probe's kept regions read 6 GiB as fast as its dropped ones while keeping cost 2x in the
run then. Writes into a new file showed the gap in every round of ``benchmarks/fresh_memory.py``, even
right after GiBs were freed: a timed rule could be built on them, but it has been seen on one machine
with a balloon only, and would cost seconds of every run. So :func:`free_page_reporting` reads the
balloon's negotiated features instead of timing anything.
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
