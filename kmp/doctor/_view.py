"""How a `kmp.diagnose` report looks: rich tables and a PNG.

`Diagnosis.show()` and `Diagnosis.plot(path)` hand this module what to
draw: the per-layer reports, the format, the loss scale and the lines to
print. It draws them and calls nothing back.
"""

import math

import numpy as np

from kmp.console import make_console
from kmp.doctor.numerics import LOG2_MAX
from kmp.doctor.numerics import LOG2_MIN
from kmp.doctor.numerics import as_power_of_two
from kmp_config.names import HALF_DTYPES

GRADIENT_KEY = (
    "a.grad: gradient by the layer's outputs; w.grad: by its weights. @1: "
    "without scaling; @S: at the loss scale S; 0 in run: nonzero in "
    "float32, 0 in the mixed run."
)


def _percent(fraction):
    if fraction is None:
        return "-"
    if fraction == 0:
        return "0"
    if fraction < 1e-4:
        return "<0.01%"
    return f"{fraction:.2%}"


def _number(value, fmt="{:.3g}"):
    if value is None:
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return fmt.format(value)


def activation_rows(layers, fmt):
    """Header and rows of the activations table, as strings."""
    header = [
        "layer",
        "class",
        "dtype",
        "max |x|",
        "headroom (2^k)",
        f"> {fmt.max:g}",
        f"< {as_power_of_two(fmt.min_subnormal)}",
        f"< {as_power_of_two(fmt.min_normal)}",
        "rel. error",
        "verdict",
    ]
    rows = []
    for layer in layers:
        act = layer.activations
        rows.append(
            [
                layer.path,
                layer.class_name,
                layer.dtype or "-",
                _number(act and act.max_abs),
                _number(act and act.headroom, "{:.1f}"),
                _percent(act and act.overflow),
                _percent(act and act.lost),
                _percent(act and act.subnormal),
                _number(act and act.relative_error, "{:.1e}"),
                layer.verdict,
            ]
        )
    return header, rows


def gradient_rows(layers, fmt, loss_scale):
    """Header and rows of the gradients table, as strings."""
    scale = as_power_of_two(loss_scale)
    lost = f"<{as_power_of_two(fmt.min_subnormal)}"
    header = ["layer"]
    for kind in ("a.grad", "w.grad"):
        header += [
            f"{kind} max",
            f"{lost} @1",
            f"@{scale}",
            f">{fmt.max:g} @{scale}",
            "0 in run",
            "rel.err",
        ]
    rows = []
    for layer in layers:
        row = [layer.path]
        for report in (layer.activation_gradients, layer.weight_gradients):
            if report is None:
                row += ["-"] * 6
                continue
            row += [
                _number(report.max_abs),
                _percent(report.lost),
                _percent(report.lost_scaled),
                _percent(report.overflow_scaled),
                _percent(report.measured_lost),
                _number(report.relative_error, "{:.1e}"),
            ]
        rows.append(row)
    return header, rows


# What rich draws around each column of a table: a space either side and
# a border; and the table's closing border.
_COLUMN_FRAME, _TABLE_FRAME = 3, 1
# Layer paths longer than this are shortened rather than the table split.
_PATH_WIDTH = 44


def _narrowed(widths, least, room):
    """`widths` narrowed to sum to `room` as rich narrows a table that is
    too wide (the widest columns first, down to the next widest, the cut
    shared alike), but none below its `least`."""
    widths = list(widths)
    while sum(widths) > room:
        free = [i for i, w in enumerate(widths) if w > least[i]]
        if not free:
            break
        top = max(widths[i] for i in free)
        second = max((widths[i] for i in free if widths[i] != top), default=0)
        tops = [i for i in free if widths[i] == top]
        remaining, before = sum(widths) - room, sum(widths)
        for count, i in zip(range(len(tops), 0, -1), tops):
            cut = min(
                top - second, widths[i] - least[i], round(remaining / count)
            )
            widths[i] -= cut
            remaining -= cut
        if sum(widths) == before:
            break
    return widths


def layout(header, rows, width):
    """How to print a table of `header` and `rows` on a console `width`
    wide: `(path_width, parts)`, each part a list of `(column, width)`
    for the columns after the layer column. A part fits `width` with
    the layer column before it; each column is at least as wide as its
    widest cell and its header's longest word (headers wrap between
    words), so no number is cut; with room to spare, as wide as its
    header (where rich would narrow a column below that, it is split
    off into the next part instead). The layer column gets the widest
    path, up to `_PATH_WIDTH` and to what leaves room for the widest
    other column: a path may be shortened, a number may not."""
    cells = [
        max([len(r[i]) for r in rows], default=0) for i in range(len(header))
    ]
    least = [
        max([len(w) for w in h.split()] + [c]) for h, c in zip(header, cells)
    ]
    most = [max(len(h), c) for h, c in zip(header, cells)]
    beside = _TABLE_FRAME + 2 * _COLUMN_FRAME + max(least[1:])
    path = max(min(cells[0], _PATH_WIDTH, width - beside), len(header[0]))
    room = width - _TABLE_FRAME - _COLUMN_FRAME - path
    groups, used = [[]], 0
    for column in range(1, len(header)):
        if groups[-1] and used + least[column] + _COLUMN_FRAME > room:
            groups.append([])
            used = 0
        groups[-1].append(column)
        used += least[column] + _COLUMN_FRAME
    parts = []
    for group in groups:
        widths = _narrowed(
            [most[c] for c in group],
            [least[c] for c in group],
            room - _COLUMN_FRAME * len(group),
        )
        parts.append(list(zip(group, widths)))
    return path, parts


def show(title, layers, fmt, loss_scale, lines) -> None:
    """Prints the activations and gradients tables of `layers` (the
    `LayerReport`s), then `lines` as they are. A table wider than the
    console is split by columns (`layout`), each part led by the layer
    column."""
    from rich.table import Table
    from rich.text import Text

    console = make_console()
    for name, (header, rows) in (
        (
            "activations (float32 reference vs mixed run)",
            activation_rows(layers, fmt),
        ),
        (
            "gradients (fractions of nonzero values)",
            gradient_rows(layers, fmt, loss_scale),
        ),
    ):
        path, parts = layout(header, rows, console.width)
        for number, part in enumerate(parts):
            heading = name if number == 0 else f"{name}, continued"
            if number == 0 and name.startswith("activations"):
                heading = f"{title}\n{heading}"
            last = number == len(parts) - 1
            table = Table(
                title=heading,
                caption=GRADIENT_KEY if "grad" in name and last else None,
            )
            # Layer paths are what the reader looks up: never wrapped.
            table.add_column(header[0], no_wrap=True, width=path)
            for column, width in part:
                table.add_column(header[column], justify="right", width=width)
            for row in rows:
                style = "bold red" if row[-1] == "pin to float32" else None
                # Text, not markup: a path may hold "[".
                cells = [row[0]] + [row[column] for column, _ in part]
                table.add_row(*map(Text, cells), style=style)
            console.print(table)
    for line in lines:
        console.print(line, highlight=False, markup=False)


def _curve(histogram, total):
    """x (binade) and y (fraction of `total`) of a trimmed histogram."""
    counts = np.append(np.asarray(histogram["counts"], float), 0.0)
    x = histogram["start"] + np.arange(counts.size)
    return x, counts / max(total, 1)


def plot(path, title, layers, fmt, loss_scale, worst=3) -> None:
    """Draws the doctor's PNG of `layers` (the `LayerReport`s); see
    `Diagnosis.plot`."""
    # A bare Figure, not pyplot: the user's matplotlib backend and open
    # figures stay as they are.
    from matplotlib.figure import Figure

    shift = math.log2(loss_scale)
    figure = Figure(figsize=(13, 4.6))
    axes = figure.subplots(1, 2)
    kinds = (
        ("activation_gradients", "Activation gradients"),
        ("weight_gradients", "Weight gradients"),
    )
    lost_edge = math.log2(fmt.min_subnormal)
    normal_edge = math.log2(fmt.min_normal)
    max_edge = math.log2(fmt.max)
    for axis, (kind, axis_title) in zip(axes, kinds):
        reports = [
            (layer.path, getattr(layer, kind))
            for layer in layers
            if layer.dtype in HALF_DTYPES
            and getattr(layer, kind) is not None
            and getattr(layer, kind).histogram["counts"]
        ]
        low, high = lost_edge - 6, max_edge + 2
        if reports:
            pooled = np.zeros(LOG2_MAX - LOG2_MIN + 1)
            total = 0
            for _, report in reports:
                start = report.histogram["start"] - LOG2_MIN
                counts = report.histogram["counts"]
                pooled[start : start + len(counts)] += counts
                total += sum(counts)
            nonzero = np.flatnonzero(pooled)
            x = np.arange(pooled.size) + LOG2_MIN
            low = min(low, x[nonzero[0]] - 1)
            high = max(high, x[nonzero[-1]] + shift + 2)
            axis.step(
                x,
                pooled / total,
                where="post",
                color="black",
                linewidth=2,
                label="all layers, unscaled",
            )
            if shift:
                axis.step(
                    x + shift,
                    pooled / total,
                    where="post",
                    color="black",
                    linestyle="--",
                    linewidth=1.5,
                    label=f"all layers x {as_power_of_two(loss_scale)}",
                )
            ranked = sorted(
                reports,
                key=lambda item: (item[1].lost_scaled, item[1].lost),
                reverse=True,
            )
            for name, report in ranked[:worst]:
                cx, cy = _curve(
                    report.histogram, sum(report.histogram["counts"])
                )
                axis.step(
                    cx,
                    cy,
                    where="post",
                    linewidth=1,
                    alpha=0.8,
                    label=f"{name} (unscaled)",
                )
        else:
            axis.text(
                0.5,
                0.5,
                "no half-precision gradients",
                ha="center",
                va="center",
                transform=axis.transAxes,
            )
        axis.axvspan(
            low,
            lost_edge,
            color="tab:red",
            alpha=0.12,
            label=f"lost (< 2^{lost_edge:g})",
        )
        axis.axvspan(
            lost_edge,
            normal_edge,
            color="tab:orange",
            alpha=0.15,
            label="subnormal",
        )
        axis.axvspan(
            normal_edge,
            max_edge,
            color="tab:green",
            alpha=0.08,
            label=f"{fmt.name} normal",
        )
        axis.axvspan(
            max_edge,
            high,
            color="tab:red",
            alpha=0.25,
            label=f"overflow (> {fmt.max:g})",
        )
        axis.set_xlim(low, high)
        axis.set(
            title=axis_title,
            xlabel="log2 |value|",
            ylabel="fraction of nonzero values per binade",
        )
        axis.legend(fontsize=7, loc="upper left")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
