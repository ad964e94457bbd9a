"""Memory-profiling benchmark harness: run loading strategies, sample memory, report results."""
