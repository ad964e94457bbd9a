"""``python -m weightmap``: see :mod:`weightmap.cli`."""

from weightmap.cli import main

raise SystemExit(main())
