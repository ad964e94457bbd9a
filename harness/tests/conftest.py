"""Fixtures shared by the harness's tests."""

from __future__ import annotations

import pytest

from harness.budget.cgroup import MemoryGroup
from harness.budget.controller import CgroupUnavailable, MemoryController, find_controller
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
