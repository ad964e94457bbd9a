"""Memory-profiling benchmark harness: run loading strategies, sample memory, report results.

A scenario goes from the command line to the figures in one direction:

``cli``
    ``python -m harness run|plot``; every :class:`~harness.errors.HarnessError` is one
    line ``error: ...`` and exit status 2.
``scenario``
    The TOML file, validated into a :class:`~harness.scenario.Scenario` (or one built in code).
``plan``
    The scenario resolved once, in the parent: backend and device, the model on meta
    (``models``), its engines as tensor names (``partition``), the checkpoint
    (``checkpoints``). Written to ``plan.json``.
``run``
    One supervised ``worker`` process per strategy, staged results, the run's record.
``worker``
    One strategy (``strategies``: the registry) measured from the plan: ``sampler``,
    ``procfs``, ``residency``, ``gpu``; engines built by ``backends``; progress by ``progress``.
``record``
    The results layout: version, file names, CSV columns, typed records.
``metrics``
    Every derived figure: peaks from samples, the floor, the compared peak, the excess.
``results``
    A results directory read back, with its metrics, for the reporters.
``report``
    The markdown report (``report.markdown``, ``report.table``, ``report.notes``) and one
    module per figure (``headline``, ``timeline``, ``engines``, ``peaks``), sharing
    ``report.text`` and ``report.style``.

``atomic`` is the one way files are written; ``machine`` says where a result was made;
``bench_map`` times mapping against the usual lazy loaders.
"""
