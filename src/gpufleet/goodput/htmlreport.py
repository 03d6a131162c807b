"""``gpufleet goodput report RUN_DIR --html FILE``: one self-contained HTML page (charts embedded as PNG
data, no external assets: it opens on an air-gapped laptop and survives being attached to a ticket).

Charts: where the wall-clock time went (each settled interval as a bar split into productive time and
badput by category), the badput totals, and MFU per interval. matplotlib is needed (``pip install
'gpufleet[report]'``); without it the command fails before writing anything, naming ``--html``.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any

from gpufleet.domain.errors import InvalidInput
from gpufleet.goodput.runreport import RunReport, render_text
from gpufleet.goodput.tco import Tco

# one colour per badput category (productive time is green), in the order the report lists them
_PRODUCTIVE = "#2e7d32"
_COLOURS = ["#c62828", "#ef6c00", "#f9a825", "#6a1b9a", "#1565c0", "#00838f", "#4e342e", "#757575", "#ad1457"]


def write_html(path: Path, r: RunReport, cost: Tco | None, source: str) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot as plt
    except ImportError:
        raise InvalidInput("--html", str(path), "matplotlib installed (pip install 'gpufleet[report]')") from None
    if not path.parent.is_dir():
        raise InvalidInput("--html", str(path), "a file in an existing directory")
    charts = [("Where the time went, interval by interval (within one, badput drawn before training)",
               _timeline(plt, r)),
              ("Badput by category", _badput(plt, r))]
    if any(i.mfu is not None for i in r.intervals):
        charts.append(("MFU per interval (in steps)", _mfu(plt, r)))
    body = "\n".join(f"<h2>{html.escape(t)}</h2>\n<img alt=\"{html.escape(t)}\" src=\"data:image/png;base64,{png}\">"
                     for t, png in charts)
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gpufleet goodput: {html.escape(source)}</title>
<style>body{{font-family:sans-serif;max-width:1000px;margin:2em auto}}pre{{background:#f5f5f5;padding:1em}}
img{{max-width:100%}}</style></head>
<body><h1>Goodput report: {html.escape(source)}</h1>
<pre>{html.escape(render_text(r, cost))}</pre>
{body}
</body></html>
"""
    path.write_text(page, encoding="utf-8")
    return path


def _png(plt: Any, fig: Any) -> str:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _categories(r: RunReport) -> list[str]:
    return list(r.goodput.badput.as_dict())


def _timeline(plt: Any, r: RunReport) -> str:
    fig, ax = plt.subplots(figsize=(10, 2.6))
    t0 = r.intervals[0].start if r.intervals else 0.0
    cats = _categories(r)
    for i in r.intervals:
        left = i.start - t0  # badput first (start-up and restore open an interval), then training
        for name, secs in i.badput.as_dict().items():
            if secs > 0:
                ax.barh(0, secs, left=left, color=_COLOURS[cats.index(name) % len(_COLOURS)], height=0.6)
                left += secs
        ax.barh(0, i.productive, left=left, color=_PRODUCTIVE, height=0.6)
    handles = [plt.Rectangle((0, 0), 1, 1, color=_PRODUCTIVE)] + [
        plt.Rectangle((0, 0), 1, 1, color=_COLOURS[k % len(_COLOURS)]) for k in range(len(cats))]
    ax.legend(handles, ["productive", *cats], ncol=5, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.35))
    ax.set_yticks([])
    ax.set_xlabel("seconds since the first launch")
    return _png(plt, fig)


def _badput(plt: Any, r: RunReport) -> str:
    items = [(k, v) for k, v in r.goodput.badput.as_dict().items() if v > 0]
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.35 * max(len(items), 1)))
    cats = _categories(r)
    ax.barh([k for k, _ in items], [v for _, v in items],
            color=[_COLOURS[cats.index(k) % len(_COLOURS)] for k, _ in items])
    ax.set_xlabel(f"seconds (of {r.goodput.elapsed:.0f} s elapsed; ETTR {100 * r.goodput.ettr:.2f} %)")
    return _png(plt, fig)


def _mfu(plt: Any, r: RunReport) -> str:
    t0 = r.intervals[0].start
    shown = [i for i in r.intervals if i.mfu is not None]
    fig, ax = plt.subplots(figsize=(10, 2.6))
    ax.step([i.end - t0 for i in shown], [100 * (i.mfu or 0.0) for i in shown], where="pre", color="#1565c0")
    ax.set_ylabel("MFU %")
    ax.set_xlabel("seconds since the first launch (interval ends)")
    ax.set_ylim(bottom=0)
    return _png(plt, fig)
