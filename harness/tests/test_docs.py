"""Prose that restates code, checked against it: the report's list of figures and each figure module's file name."""

from __future__ import annotations

import importlib
import re

import pytest

import harness.report as report
from harness.report import FIGURES
from harness.report.names import figure_name


def test_the_report_package_lists_every_figure_in_the_order_it_shows_them() -> None:
    listed = re.findall(r"^\* ``<name>\.([\w-]+)\.png`` \(:mod:`([\w.]+)`\)", report.__doc__ or "", flags=re.M)
    assert listed == [(kind, f.__module__) for kind, f in FIGURES.items()]


@pytest.mark.parametrize("kind", list(FIGURES))
def test_each_figure_module_names_its_file_as_figure_name_does(kind: str) -> None:
    doc = importlib.import_module(FIGURES[kind].__module__).__doc__ or ""
    assert f"``{figure_name('<name>', kind)}``" in doc
    stale = [f"<name>-{k}.png" for k in FIGURES if f"<name>-{k}.png" in doc]
    assert stale == [], f"{FIGURES[kind].__module__} names figure files the old way: {stale}"
