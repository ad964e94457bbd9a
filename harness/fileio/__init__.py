"""Files beneath everything: the one atomic writer (``atomic.py``), bounded readers of JSON and CSV
(``files.py``), the one strict typed codec of every record, plan and scenario (``codec.py``), and how a
record holds a path (``paths.py``). No torch, and nothing of the harness above the error and unit modules."""
