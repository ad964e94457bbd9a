"""``python -m weightmap``: see :mod:`weightmap.cli`."""

import sys

try:
    from weightmap.cli import main

    status = main()
except KeyboardInterrupt:  # while importing torch, before main() handles it
    print("interrupted", file=sys.stderr)
    status = 130
raise SystemExit(status)
