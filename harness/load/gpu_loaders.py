"""The GPU loader peers' hooks by strategy name, both uses of each, and the check that refuses a scenario that
lists one this machine cannot run before any strategy runs."""

from __future__ import annotations

from collections.abc import Sequence

from harness.load.gpu_peers import DeviceHooks, FastSafetensorsHooks, InstantTensorHooks, StPrefetchHooks
from harness.load.gpu_whole import FastSafetensorsWholeHooks, InstantTensorWholeHooks, StPrefetchWholeHooks

__all__ = ["LOADER_HOOKS", "check_loaders"]

LOADER_HOOKS: dict[str, type[DeviceHooks]] = {
    hooks.strategy: hooks
    for hooks in (StPrefetchHooks, StPrefetchWholeHooks, FastSafetensorsHooks, FastSafetensorsWholeHooks,
                  InstantTensorHooks, InstantTensorWholeHooks)}
"""Each GPU loader peer's hooks, by strategy name: per engine (:mod:`harness.load.gpu_peers`) and the whole
checkpoint in one open (:mod:`harness.load.gpu_whole`), in the catalog's order."""


def check_loaders(strategies: Sequence[str], device: str) -> None:
    """Fail fast, before any strategy runs: :class:`~harness.load.gpu_peers.LoaderUnavailable` for the first of
    ``strategies`` that is a GPU loader peer and cannot run on ``device`` (the plan's resolved device) here
    (``check`` of its hooks). Other strategies need nothing beyond the harness's own dependencies."""
    for name in strategies:
        if name in LOADER_HOOKS:
            LOADER_HOOKS[name].check(device)
