"""Fixtures shared by the harness's tests."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from harness.budget.cgroup import MemoryGroup
from harness.budget.controller import CgroupUnavailable, MemoryController, find_controller
from harness.tests.slurm_cluster import LocalSlurm, SlurmUnavailable
from harness.tests.slurm_cluster import start as start_slurm
from harness.units import MIB


@pytest.fixture(scope="module")
def controller() -> MemoryController:
    """This machine's memory-cgroup controller, once a 64 MiB group was made and removed in it;
    the test is skipped, with the reason, where no group can be made."""
    try:
        found = find_controller()
        with MemoryGroup.create(64 * MIB, controller=found):
            pass
    except CgroupUnavailable as exc:
        pytest.skip(str(exc))
    return found


@pytest.fixture(scope="session")
def slurm() -> Iterator[LocalSlurm]:
    """A one-node Slurm on this machine (:mod:`harness.tests.slurm_cluster`: installed where missing, started
    here, stopped after the session), ``SLURM_CONF`` set to it; skipped, with the reason, where it cannot start."""
    try:
        cluster = start_slurm()
    except SlurmUnavailable as exc:
        pytest.skip(f"no local Slurm: {exc}")
    before = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        yield cluster
    finally:
        if before is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = before
        cluster.stop()
