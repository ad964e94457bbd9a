"""Memory-profiling benchmark harness: run loading strategies, sample memory, report results.

``python -m harness run|budget|plot`` (:mod:`harness.cli`); every
:class:`~harness.errors.HarnessError` is one line ``error: ...`` and exit status 2.

The folders, from the bottom up (each imports only what is below it or beside it):

``catalog``
    Strategy and backend names, the strategies' labels and colours; no torch.
``measure``
    The sampler, page residency, ``/proc``, the GPU, the cold cache, the disk read, the machine.
``models``
    The models, built on meta, and their generated checkpoints.
``load``
    The strategy registry (``load.strategies``) and the peers' loaders (``load.peers``).
``engines``
    How engines are built: the partition, the builder interface and its registry, the copy
    builders, the AOTInductor compiler (``engines.compile``).
``results``
    The results layout (``record``, read and written by ``codec``), derived figures (``metrics``),
    reading a results directory back (``reading``), writing files (``atomic``), staging and
    publishing a run (``publish``).
``report``
    The markdown report and the figures, from ``results.reading``; no torch.
``budget``
    Budget mode: memory cgroups, the sweep, its record and its signals.

On top: ``scenario`` (the TOML validated), ``plan`` (resolved once, in the parent),
``worker`` (one strategy in one process), ``run`` (a scenario's supervised run, staged then
published), ``stopping`` (the signals that stop a run or a sweep), ``progress``, ``errors``,
and ``cli``, which runs a scenario or a sweep and then renders it; ``bench_map`` times mapping
against the usual lazy loaders.
"""
