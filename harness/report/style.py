"""What every figure shares: colours, matplotlib settings, the provenance footer, legends, saving.

Figures are drawn on the Agg canvas without pyplot, so rendering touches no global backend state.
"""

from __future__ import annotations

import functools
import io
import re
import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import matplotlib as mpl
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.layout_engine import ConstrainedLayoutEngine

from harness.catalog import strategy_colour
from harness.fileio.atomic import write_atomic
from harness.report.text import footer_text, gib_decimals
from harness.results.reading import Results
from harness.units import GIB, format_gib

__all__ = [
    "FLOOR_STYLE",
    "MODEL_STYLE",
    "SERIES_COLOURS",
    "STYLE",
    "coinciding",
    "figure_legend",
    "figure_png",
    "gib",
    "keep_units",
    "model_label",
    "new_figure",
    "save_figure",
    "strategy_colour",
    "strategy_line",
    "styled",
]

STYLE: dict[str, Any] = {
    "font.size": 10,
    "axes.titlesize": 10,
    "axes.labelsize": 10,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "legend.fontsize": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
}
"""Matplotlib settings every figure is drawn with: no text under 9 pt."""

SERIES_COLOURS = {
    "anon": "#E69F00",
    "file": "#56B4E9",
    "resident": "#009E73",
    "gpu": "#7B3294",
    "host_gpu": "#8B0000",
    "model": "#555555",
    "floor": "#000000",
    "weights": "#C8C8C8",
    "phase": "#444444",
}
"""One colour per memory series, the same in every figure."""

MODEL_STYLE: dict[str, Any] = {"color": SERIES_COLOURS["model"], "linestyle": "-", "linewidth": 1.3}
FLOOR_STYLE: dict[str, Any] = {"color": SERIES_COLOURS["floor"], "linestyle": "--", "linewidth": 1.4}
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")
_LINESTYLES: tuple[Any, ...] = ("-", "--", "-.", ":", (0, (6, 2, 1, 2, 1, 2)))
_FOOTER_PT = 9
_LEGEND_CHARS = 60
_DPI = 120
_UNIT_SPACE = re.compile(r"(?<=\d) (?=(?:s|GiB|MiB|KiB|MB/s|ms|x|×)(?![A-Za-z]))")
"""The space between a number and its unit (``12.7 s``, ``1.2 GiB``), where a wrapped line must not break."""


def styled(build: Callable[[Results], Figure]) -> Callable[[Results], Figure]:
    """Draw a figure under :data:`STYLE`, whoever calls the builder."""

    @functools.wraps(build)
    def wrapper(run: Results) -> Figure:
        with mpl.rc_context(cast(Any, STYLE)):
            return build(run)

    return wrapper


def new_figure(width: float, height: float, run: Results) -> Figure:
    """A constrained-layout figure with the provenance footer reserved at the bottom."""
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    chars = max(60, int(width * 72 / (_FOOTER_PT * 0.56)))
    lines = textwrap.wrap(footer_text(run), width=chars, break_on_hyphens=False)
    footer_in = (len(lines) * _FOOTER_PT * 1.35 + 8) / 72
    fig.text(
        0.01,
        0.04 / height,
        "\n".join(lines),
        fontsize=_FOOTER_PT,
        color="#333333",
        ha="left",
        va="bottom",
        linespacing=1.35,
    )
    engine = fig.get_layout_engine()
    if isinstance(engine, ConstrainedLayoutEngine):
        engine.set(rect=(0.0, footer_in / height, 1.0, 1.0 - footer_in / height))
    return fig


def _legend_columns(widths: list[float], ncols: int) -> list[list[float]]:
    """Split entries into columns as matplotlib does: in order, column sizes differing by at most one."""
    base, extra = divmod(len(widths), ncols)
    columns, start = [], 0
    for i in range(ncols):
        size = base + (1 if i < extra else 0)
        if size:
            columns.append(widths[start : start + size])
        start += size
    return columns


def keep_units(text: str) -> str:
    """``text`` with every space between a number and its unit made a no-break space, so that wrapping it
    (:mod:`textwrap` breaks at ASCII whitespace only) never puts a unit on a line of its own."""
    return _UNIT_SPACE.sub("\u00a0", text)


def wrapped_title(fig: Figure, title: str, size: float) -> str:
    """``title`` broken into lines that fit 95% of the figure's width in bold type of ``size`` points
    (about 0.62 em a character)."""
    return "\n".join(textwrap.wrap(title, int(fig.get_figwidth() * 72 * 0.95 / (size * 0.62))))


def figure_legend(fig: Figure, handles: list[Any], title: str) -> None:
    """The figure's legend above the axes, titled with the figure's title.

    The title lives in the legend because constrained layout does not keep a suptitle clear of a
    legend placed outside the axes. Columns are as many as the figure's width holds.
    """
    for handle in handles:  # long labels wrap, so that entries can sit side by side
        handle.set_label("\n".join(textwrap.wrap(keep_units(handle.get_label()), _LEGEND_CHARS)))
    widths = [(max(len(line) for line in h.get_label().splitlines()) * 0.6 * 9 + 45) / 72 for h in handles]
    ncols = 1
    for candidate in range(len(widths), 0, -1):
        if sum(max(column) for column in _legend_columns(widths, candidate)) <= fig.get_figwidth() * 0.95:
            ncols = candidate
            break
    fig.legend(
        handles=handles,
        loc="outside upper center",
        ncols=ncols,
        frameon=False,
        title=wrapped_title(fig, title, 12),
        title_fontproperties={"size": 12, "weight": "bold"},
    )


def strategy_line(name: str, order: Sequence[str]) -> dict[str, Any]:
    """Colour, marker and line style of strategy ``name``'s lines: each strategy in ``order`` its own
    marker and line style as well as its colour, so that lines lying on one another stay told apart."""
    index = list(order).index(name) if name in order else len(order)
    return {"color": strategy_colour(name, order), "marker": _MARKERS[index % len(_MARKERS)],
            "linestyle": _LINESTYLES[index % len(_LINESTYLES)]}


def coinciding(series: Mapping[str, Mapping[Any, float]], tolerance: float) -> dict[str, str]:
    """Which series lie on an earlier one: ``{name: the earlier series' name}``.

    Two series coincide when they have values at the same points and differ by at most
    ``tolerance`` at every one; each is matched with the first earlier series it coincides
    with that does not itself lie on another. Series without points coincide with none.
    """
    same: dict[str, str] = {}
    leaders: list[str] = []
    for name, values in series.items():
        match = next((lead for lead in leaders if values and series[lead].keys() == values.keys()
                      and all(abs(values[k] - series[lead][k]) <= tolerance for k in values)), None)
        if match is None:
            leaders.append(name)
        else:
            same[name] = match
    return same


def model_label(run: Results) -> str:
    """The legend entry of the model-size line, in GiB."""
    model = run.record.model.bytes
    return f"model size ({format_gib(model, gib_decimals(model))})"


def gib(values: Any) -> Any:
    """``values`` (bytes) as a float array in GiB."""
    return np.asarray(values, dtype="float64") / GIB


def figure_png(fig: Figure) -> bytes:
    """``fig`` as PNG."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=_DPI)
    return buffer.getvalue()


def save_figure(fig: Figure, path: Path) -> Path:
    """Write ``fig`` as PNG to ``path`` atomically."""
    return write_atomic(path, figure_png(fig))
