"""What the harness measures and how: the sampler, page-cache residency, ``/proc`` readers, GPU memory,
the page cache's cold state, the disk's read bandwidth and the machine."""
