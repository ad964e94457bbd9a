"""The public names of ``weightmap``: each listed once, each what its module defines, none needing torch to list."""

from __future__ import annotations

import importlib
import subprocess
import sys

import weightmap


def test_every_public_name_is_its_modules_own_object() -> None:
    assert sorted(weightmap.__all__) == sorted(weightmap._WHERE)
    for name, module in weightmap._WHERE.items():
        assert getattr(weightmap, name) is getattr(importlib.import_module(module), name), name


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        weightmap.no_such_name  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("expected an AttributeError")


def test_the_torch_free_parts_import_without_torch() -> None:
    code = ("import sys; from weightmap import PREFETCH_METHODS, non_regular_kind, parse_size; "
            "import weightmap.filekinds; "
            "assert 'torch' not in sys.modules, 'torch was imported'; print(PREFETCH_METHODS)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
