"""Memory-profiling benchmark harness: run loading strategies, sample memory, report results.

``python -m harness run|budget|plot|compare|schema`` (:mod:`harness.cli`); every
:class:`~harness.errors.HarnessError` is one line ``error: ...`` and exit status 2.

The folders and modules, in layers from the bottom up: each imports only from its own layer or those
below it (``harness/tests/test_imports.py`` holds the layers and checks the imports and this list against them):

``errors`` ``units`` ``catalog`` ``backends`` ``stopping``
    The one-line error; the binary units of bytes (KiB to PiB); strategy names, their labels and colours, and the
    weight settings (no torch); every backend described once, its spec (no torch); the signals that stop a run or
    a sweep.
``fileio``
    Files beneath everything: the one atomic writer (``atomic``), regular files read and JSON of bounded depth
    (``files``), the one strict typed codec of every record, plan and scenario table (``codec``), and paths as a
    record holds them (``paths``).
``results``
    The results layout (``record``, its history ``layouts``, its disk measurements ``disk`` and its samples
    and events CSVs ``samples``), the memory figures' labels (``labels``), derived figures (``metrics``), a
    strategy's repeats combined (``repeats``), reading a results directory back (``reading``), staging and
    publishing a run (``publish``), results names (``names``), two runs compared (``comparison``, ``spread``), the
    settings the strategies that map read with (``checkpoint_reading``).
``measure`` ``progress``
    The sampler, page residency, ``/proc``, the GPU, the cold cache, the disk read, the read probe and
    ceiling, the shared disk, the machine; the bars and lines printed while a run goes.
``scenario`` ``scenario_rules`` ``scenario_cluster`` ``scenario_file`` ``cli_scenario`` ``weightspec``
    The TOML validated, and a scenario written back as TOML; the scenario the command line's flags describe
    without a file; a weight spec's JSON read and its size checked, without torch; the ``[cluster]`` table.
``models`` ``load``
    The models (the harness's own, a user's factory, a transformers config), built on meta, and their
    generated checkpoints; the strategy registry
    (``load.strategies``) and the peers' loaders (``load.peers``).
``engines``
    How engines are built: the partition, the builder interface and its registry, the copy builders, the
    compilers (``engines.compile``).
``checkpoint_reading`` ``plan``
    The prefetch and drop-cache settings, set or chosen by a read probe; the scenario resolved once, in
    the parent.
``worker`` ``watch`` ``reference`` ``rounds`` ``run_record`` ``round_run`` ``run``
    One strategy in one process; its worker watched from outside, under the scenario's limits; the reference
    measurements beside the strategies; the strategies' order in each round; the run's plan written and its record
    as it starts; one round of worker runs, each supervised, its record read and its line said; a scenario's
    supervised run, staged then published, its discarded warm-up rounds first.
``budget`` ``predict`` ``cluster``
    Budget mode: memory cgroups, the sweep, its record and its signals; each strategy's memory predicted from
    sizes alone (``rules``) and checked against the committed results (``check``); budget attempts run as Slurm
    jobs whose ``--mem`` is the limit (``cluster``).
``report``
    The markdown report and the figures, from ``results.reading``; no torch.
``cli`` ``schema`` ``bench_map`` ``__main__``
    The command line, which runs a scenario or a sweep and then renders it; a scenario file's keys and the
    results layouts, read from the dataclasses' fields; ``bench_map`` times mapping against the usual lazy
    loaders.
"""
