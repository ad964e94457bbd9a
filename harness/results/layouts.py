"""The results layout's history: what the keys each version added mean.

:data:`harness.results.record.LAYOUT_VERSION` is what this code writes; ``summary.json`` says which
version it is in ``layout``. ``python -m harness schema layouts`` lists the keys each version added, read
from each field's ``since`` (:func:`harness.schema.layout_history`); each entry below says what they
mean, and ``harness/tests/test_schema.py`` checks that it names every key its version added and none
a later one did:

1. No ``layout`` key. The results committed before the layout had a version.
2. Adds ``layout``; per strategy ``load_hwm_bytes`` (the kernel's high-water mark read
   at partitioning, which covers the load), ``gpu_baseline_bytes`` (NVML ``used`` taken
   as GPU zero) and ``build_peak_bytes`` (the build-phase host peak); per engine
   ``tensors``. ``phases`` always holds its four keys (``null`` for a phase not reached).
   Reading version 1 fills ``load_hwm_bytes``, ``gpu_baseline_bytes`` and ``tensors`` with
   ``None``, and ``build_peak_bytes`` with version 1's own build-phase peak: on a CPU
   device that is ``host_gpu_peak_bytes`` (no GPU memory adds to it), on a GPU the
   largest engine high-water mark.

3. Adds, for compiler backends (``inductor``): per engine ``compile_s``, ``artifact_bytes``,
   ``rss_before_bytes`` (RSS when its build began), ``children_peak_bytes`` (the compiler's
   subprocesses' summed RSS, sampled) and ``cache_bytes`` (growth of the compiler's cache); per strategy
   ``compiler`` and ``compiler_weights`` (the backend's weight setting), ``export`` (an
   :class:`ExportRecord`: the export phase), ``max_abs_diff`` and ``check`` (the built model
   against eager); ``phases`` gains ``export_start_s`` and ``export_end_s``. All ``None`` for
   the ``copy`` backend and when reading version 1 or 2.
4. Adds, per run, ``repeats`` (cold runs per strategy), ``prefetch`` (the scenario's
   prefetch setting) and ``disk_reads`` (:class:`~harness.results.disk.DiskRead`: cold sequential reads of the
   checkpoint made in the same run, the reference for read-bound time); per strategy
   ``cache`` (:class:`CacheRecord`: how the page cache was prepared and the checkpoint's
   residency at load start), ``prefetch`` and ``drop_cache`` (what its release plan was
   asked to do), ``prefetch_warmed_bytes``, ``repeat`` (which repeat the record is) and
   ``repeats`` (:class:`RepeatRecord`, one per cold run); per engine ``pages_s``,
   ``copy_s`` and ``major_faults``.
5. Adds ``phases.check_start_s`` and ``phases.check_end_s``: the built model run and compared
   with eager, after the build (``None`` where the builder has nothing to check, and when
   reading versions 1 to 4).
6. ``compiler_weights = "packaged"`` now means engines whose weights the harness streamed into
   the artifact; the compiler's own packaging is ``"packaged_compiler"``. Reading versions 3 to
   5 reads their ``"packaged"`` as ``"packaged_compiler"``, which is what they measured.
7. Adds ``check_peak_bytes``: the host high-water mark of the processes the built model was
   checked in (the check left the measuring process); ``None`` where nothing was checked or the
   check ran in the measuring process, and when reading versions 1 to 6. Per engine a compiler
   built: ``compile_hwm_bytes`` (the high-water mark when the compiler was done: for
   ``packaged``, before the weights were written); for ``packaged`` also ``write_rss_bytes``,
   ``write_peak_bytes`` and ``write_read_bytes`` (RSS when the weights began to be written
   into the artifact, the largest RSS while they were, and the largest rise of file-backed RSS
   meanwhile: the source pages resident at once). ``None`` where not measured. Per run,
   ``read_ceiling``: the points of the disk's read-ceiling sweep (:class:`~harness.results.disk.CeilingPoint`), made
   before the first round of a cold run, followed, in runs since the sweep repeats its best settings, by the
   repeated reads of its fastest settings (same threads and request size; a setting's rate is the median of its
   reads); empty where none was made. ``speed``
   (:class:`~harness.results.checkpoint_reading.ReadingChoice`): the prefetch and drop-cache settings the run's
   strategies that map used, each set by the scenario or chosen by a read probe of the checkpoint
   (:class:`~harness.results.disk.ReadProbe`) at the run's start; ``None`` when reading versions 1 to 6.
8. Adds, per strategy, where its prefetch threads spent their time: ``prefetch_busy_s`` (seconds
   in the calls that ask for pages ahead) and ``prefetch_evict_s`` (seconds dropping released
   weights from the page cache, on the prefetcher's eviction thread beside the asking one).
   ``None`` without prefetch, and when reading versions 1 to 7.
9. Adds, per run, ``round_orders``: the order the strategies ran in, one list per measured round
   (:func:`harness.rounds.round_order`: it changes from round to round, so that no strategy always
   follows the same one). Reading versions 1 to 8 fills in the order they ran in: the scenario's
   (the order of ``strategies``), the same in every round.
10. Adds, per run, ``shared_disk`` (:class:`~harness.results.disk.SharedDisk`, one per time it was measured): the
    checkpoint read cold and as many bytes written as engine files, each alone and both at once, measured after
    the last round of a cold run whose engines are written as files of their weights; empty where
    none was made, and when reading versions 1 to 9.
11. Adds, per strategy, ``sample_rows`` and ``event_rows``: how many data rows its process wrote into
    ``samples-<strategy>.csv`` and ``events-<strategy>.csv``. A file with fewer or more rows than its record
    states is refused (one cut exactly at the end of a row reads as a whole CSV otherwise). ``None`` where
    the process wrote no such file or no record (the harness's record of a killed worker), and when reading
    versions 1 to 10: such files are read without the check.
12. Adds why a reference measurement failed, where one did (it is recorded as failed and the run goes
    on): per run ``read_ceiling_error`` (the read-ceiling sweep; ``read_ceiling`` is then empty) and
    ``shared_disk_error`` (the shared disk: ``shared_disk`` holds the times measured before it), and in
    ``speed`` ``probe_error`` (the read probe: the settings are then chosen as for a checkpoint not
    probed). ``None`` where it did not fail, and when reading versions 1 to 11.
13. Adds, per engine a compiler built, ``children_pss_bytes``: the largest sum of the PSS of the compiler's
    subprocesses (each page they share split among the processes that map it), what they add to the
    machine's memory; ``children_peak_bytes`` beside it stays their summed RSS, which counts every shared
    library once per process. ``None`` when reading versions 1 to 12, whose records hold the summed RSS
    only.
14. Adds, per engine a compiler built in two calls (OpenVINO: convert, then compile), ``convert_s`` and
    ``convert_hwm_bytes`` (the high-water mark when the conversion was done), and ``compiler_read_bytes`` and
    ``compiler_held_bytes``: the growth of file-backed and of anonymous RSS from the engine's start to the end
    of its compile, the compiler's models still held (the weights' pages it read, and the memory it held of
    its own beside them, from which the floor of such engines follows: :func:`harness.results.metrics.floor_bytes`).
    ``None`` for other builders, and when reading versions 1 to 13.
15. Adds, per run, ``disk_read_error``: why the cold sequential read of the checkpoint before a round failed
    (``before round <r> of <n>: <reason>``), where one did; it is recorded as failed and the run goes on,
    ``disk_reads`` holding the reads before it, and no read is taken after it. ``None`` where none failed, and
    when reading versions 1 to 14.
16. Adds the split of GPU memory, for runs on a GPU (``None`` on the CPU, and when reading versions 1 to 15). Per
    strategy ``gpu_context_bytes``: NVML ``used`` right after this process's first CUDA allocation minus ``used``
    before it, less what torch's caching allocator reserved for that allocation: the CUDA context as it is created
    (``gpu_baseline_bytes``, taken after it, includes it; every GPU figure is above that baseline). Per engine:
    ``gpu_start_bytes`` (NVML ``used`` above the baseline when the engine's build began: what earlier engines and
    phases left on the device), ``gpu_peak_bytes`` (the largest NVML ``used`` above the baseline sampled while it
    was built), ``gpu_weights_bytes`` (the bytes of the device copies of the partition's weights the build made;
    compiler backends only) and ``gpu_reserved_peak_bytes`` and ``gpu_allocated_peak_bytes`` (torch's caching
    allocator's reserved and allocated high-water marks over the build, reset as it began). The compiler's own
    device memory follows from them (:func:`harness.results.metrics.compiler_gpu_own_bytes`). In ``speed``:
    ``prefetch_readers``, ``prefetch_request_bytes`` and ``prefetch_sizing_why``, how prefetch asks (one reader of
    2 MiB requests when reading versions 1 to 15).
17. Adds no key: paths (``checkpoint.path``) are written relative to the repository root where inside it, as the
    scenario gives them (``data/pi05.safetensors``), and read back resolved against the root of the reader
    (:mod:`harness.fileio.paths`); a path outside the root stays absolute. Earlier versions wrote them absolute,
    which reads as it is, so nothing is upgraded; the runs committed under ``results/`` were rewritten to relative
    paths in place, their layout unchanged (so a committed record of any version may hold either form).
18. Drops two keys that repeated a value the record holds elsewhere, so that each setting is held once:
    ``sample_interval_ms`` (the scenario's, which ``scenario_config`` holds, under ``run``) and ``prefetch`` (the
    method ``speed`` holds, where the record holds ``speed``). A record of this version holding either is refused.
    Reading versions 1 to 17 reads each where it is held now, and the dropped key only where that holds nothing
    (``scenario_config`` without the interval; versions 4 to 6, which hold no ``speed``); where both are held they
    must agree. Readers take them as before (:attr:`~harness.results.record.RunRecord.prefetch`,
    :attr:`~harness.results.record.RunRecord.sample_interval_ms`).
19. Adds, in ``checkpoint``, ``files`` (how many files hold the checkpoint's tensors: a checkpoint may now be a
    user's sharded folder or its index as well as one file) and ``dtype_bytes`` (the bytes of its tensors per
    dtype); ``bytes`` is the total of all its files. ``None`` when reading versions 1 to 18, whose checkpoint was
    one file the harness generated.
20. Adds, per budget attempt (``budget.json``), ``job_ids``, ``node`` and ``limit_enforcer``: the Slurm jobs an
    attempt run through ``--executor slurm`` was (comma-separated, the last one the one that counts), the node it
    ran on and which limit bounded it. ``None`` for attempts run on the sweep's own machine, and when reading
    versions 1 to 19.
21. Renames ``speed`` (:class:`~harness.results.checkpoint_reading.ReadingChoice`: the prefetch, readers and
    drop-cache settings of the strategies that map) ``reading``: the record of a run, and of a plan and a budget
    sweep, holds the settings under ``reading``. A record of this version holding ``speed`` is refused; versions 7
    to 20 read their ``speed`` as ``reading``.
22. Adds, per strategy, ``job_ids``, ``node`` and ``limit_enforcer``, and per run in ``repeats`` ``job_ids`` and
    ``node``: the Slurm jobs a worker run through ``run --executor slurm`` was (comma-separated, the last one the one
    that counts), the node it ran on and, where the scenario sets ``run.memory_limit_gib`` (the job's ``--mem``),
    which limit bounded it. ``None`` for workers run on the harness's own machine, and when reading versions 1 to 21.

A later version adds keys (each field says the version that added it, ``since`` in its metadata, and the last
version that held a key a later one dropped, ``until``: :mod:`harness.fileio.codec`), bumps
:data:`harness.results.record.LAYOUT_VERSION` and gets an entry above; records of earlier versions read with those
fields' defaults.

This module holds no code: the records are :mod:`harness.results.record`.
"""
