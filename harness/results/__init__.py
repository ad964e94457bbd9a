"""The results layout: the records a run writes and reads, the figures derived from them, and how they are
written (atomically) and read back."""
