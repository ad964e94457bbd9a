"""Release never leaves a tensor that crashes when read, and says plainly what it cannot release.

A storage resized to 0 under a live tensor makes the next read a segmentation
fault, which would take pytest down with it: those cases run in a subprocess.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from weightmap import release_mapped_storage, release_storage

ROOT = Path(__file__).resolve().parents[1]


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter that imports this checkout's weightmap."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def assert_survived(result: subprocess.CompletedProcess[str], expected: str) -> None:
    assert result.returncode == 0, f"the child died (returncode {result.returncode}): {result.stderr[-2000:]}"
    assert result.stdout.split() == expected.split()


def test_default_release_of_a_slice_leaves_the_whole_tensor_readable() -> None:
    result = run_python("""
        import torch
        from weightmap import release_storage
        big = torch.arange(1000, dtype=torch.float32)
        print(release_storage(big[:4].untyped_storage()))
        print(int(big.sum()), int(big[4:].sum()), big.untyped_storage().nbytes())
    """)
    assert_survived(result, f"False {sum(range(1000))} {sum(range(4, 1000))} 4000")


def test_resize_is_refused_while_another_tensor_views_the_storage() -> None:
    result = run_python("""
        import torch
        from weightmap import release_storage
        big = torch.arange(1000, dtype=torch.float32)
        head = big[:4]
        print(release_storage(head, resize=True))   # big views it too
        print(release_storage(big, resize=True))    # head views it too
        print(int(big.sum()), int(head.sum()))
    """)
    assert_survived(result, f"False False {sum(range(1000))} 6")


def test_resize_frees_a_storage_only_its_own_tensor_views() -> None:
    t = torch.ones(1024)
    assert release_storage(t, resize=True) is True
    assert t.untyped_storage().nbytes() == 0
    orphan = torch.ones(256).untyped_storage()  # no tensor views it any more
    assert release_storage(orphan, resize=True) is True
    assert orphan.nbytes() == 0


def test_ordinary_storages_are_kept_without_resize(caplog: pytest.LogCaptureFixture) -> None:
    t = torch.ones(1024)
    with caplog.at_level("DEBUG", logger="weightmap"):
        assert release_storage(t) is False
    assert t.untyped_storage().nbytes() == 4096 and int(t.sum()) == 1024
    assert "resize=True" in caplog.text


def test_refused_resize_says_why(caplog: pytest.LogCaptureFixture) -> None:
    big = torch.ones(64)
    view = big[8:]
    with caplog.at_level("DEBUG", logger="weightmap"):
        refused = release_storage(view, resize=True)  # not in the assert: a failure's repr would read it
    assert refused is False
    assert "1 more tensor(s) view it" in caplog.text
    assert big.untyped_storage().nbytes() == 256  # not resized (reading it would crash if it were)


@pytest.mark.parametrize("release", [release_storage, release_mapped_storage])
def test_meta_storage_gives_nothing_back(release: object) -> None:
    meta = torch.empty(1024, device="meta")
    assert callable(release)
    assert release(meta) is False
    assert release(meta.untyped_storage()) is False
    assert meta.untyped_storage().nbytes() == 4096  # untouched


def test_meta_storage_is_not_resized_even_when_asked() -> None:
    meta = torch.empty(1024, device="meta")
    assert release_storage(meta, resize=True) is False
    assert meta.untyped_storage().nbytes() == 4096


@pytest.mark.parametrize("release", [release_storage, release_mapped_storage])
@pytest.mark.parametrize("argument", [[1.0, 2.0], "weight", None, 3])
def test_non_tensor_argument_is_a_type_error_naming_the_type(release: object, argument: object) -> None:
    assert callable(release)
    with pytest.raises(TypeError, match=type(argument).__qualname__):
        release(argument)


def test_typed_storage_is_accepted() -> None:
    t = torch.ones(16)
    view = t[4:]
    with pytest.warns(UserWarning):  # TypedStorage is deprecated in torch
        typed = t.storage()
    assert release_storage(typed) is False
    refused = release_storage(typed, resize=True)  # t and view both view it
    assert refused is False
    assert t.untyped_storage().nbytes() == 64  # not resized
    del view
    assert release_storage(typed, resize=True) is True  # only t's own storage now
    assert t.untyped_storage().nbytes() == 0
