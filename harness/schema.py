"""The columns of the raw result files, shared by their writers and their reader."""

SAMPLE_COLUMNS = (
    "t_s",
    "rss_bytes",
    "anon_bytes",
    "file_bytes",
    "resident_bytes",
    "gpu_used_bytes",
    "gpu_reserved_bytes",
    "engine",
    "phase",
)
"""``samples-<strategy>.csv``: one row per sample of :class:`harness.sampler.Sampler`."""

EVENT_COLUMNS = (
    "t_s",
    "event",
    "engine",
    "weight_bytes",
    "host_hwm_bytes",
    "released_bytes",
    "rss_bytes",
    "gpu_used_bytes",
)
"""``events-<strategy>.csv``: load, partition and engine events of :mod:`harness.worker`."""
