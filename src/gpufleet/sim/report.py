"""``--report DIR``: an HTML page with PNG plots comparing policies (matplotlib, imported lazily).

matplotlib is in the ``report`` extra; without it the command fails with a clear message.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path

from gpufleet.domain.errors import InvalidInput
from gpufleet.goodput import theory
from gpufleet.sim.montecarlo import Summary


def write_report(out: Path, summaries: Sequence[Summary], sweep: Sequence[Summary], title: str) -> Path:
    """Write ``index.html``, ``ettr.png``, ``badput.png``, ``interval.png`` and ``summary.json``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InvalidInput("report", str(out), "matplotlib installed (pip install 'gpufleet[report]')") from None
    out.mkdir(parents=True, exist_ok=True)
    labels = [s.label for s in summaries]

    fig, ax = plt.subplots(figsize=(9, 4.5))
    try:
        ax.boxplot([s.ettrs for s in summaries], orientation="horizontal")
    except TypeError:  # matplotlib < 3.10
        ax.boxplot([s.ettrs for s in summaries], vert=False)
    ax.set_yticks(range(1, len(labels) + 1), labels)
    ax.set_xlabel("ETTR per replica")
    ax.set_title(f"{title}: ETTR by policy")
    fig.tight_layout()
    fig.savefig(out / "ettr.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(9, 4.5))
    buckets = list(summaries[0].mean_badput_hours())
    left = [0.0] * len(summaries)
    for b in buckets:
        vals = [s.mean_badput_hours()[b] for s in summaries]
        ax.barh(labels, vals, left=left, label=b)
        left = [a + v for a, v in zip(left, vals, strict=True)]
    ax.set_xlabel("badput, hours (mean over replicas)")
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title("Where the time goes")
    fig.tight_layout()
    fig.savefig(out / "badput.png", dpi=110)
    plt.close(fig)

    if sweep:
        fig, ax = plt.subplots(figsize=(7, 4))
        xs = [s.config.interval() / 60 for s in sweep]
        ax.errorbar(xs, [s.ettr_mean() for s in sweep], yerr=[2 * s.ettr_stderr() for s in sweep],
                    fmt="o", label="simulated (±2 s.e.)")
        base = sweep[0].config
        restart = base.restart_overhead + base.restore + base.requeue
        rate = 1.0 / base.mtbf()
        ax.plot(xs, [theory.expected_ettr_exact(rate, x * 60, base.checkpoint_write, restart) for x in xs],
                label="renewal formula (no planned stops, no hangs)")
        ax.axvline(theory.daly_interval(base.checkpoint_write, base.mtbf()) / 60, ls=":", label="Daly interval")
        ax.set_xlabel("checkpoint interval (minutes)")
        ax.set_ylabel("ETTR")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "interval.png", dpi=110)
        plt.close(fig)

    rows = "".join(
        f"<tr><td>{html.escape(s.label)}</td><td>{s.ettr_mean():.4f}</td><td>{s.ettr_stderr():.4f}</td>"
        f"<td>{s.mean_interruptions()['total']:.1f}</td><td>{(s.mttf_hours() or 0):.2f}</td>"
        f"<td>{s.config.interval() / 60:.1f}</td><td>{s.config.hot_spares if s.config.hot_spares is not None else '∞'}"
        f"</td></tr>"
        for s in summaries
    )
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:2em auto}}td,th{{padding:.2em .6em;text-align:right}}
td:first-child{{text-align:left}}</style></head><body>
<h1>{html.escape(title)}</h1>
<p>{len(summaries[0].replicas)} replicas per policy; gpufleet sim, production lifecycle policy.</p>
<table><tr><th>policy</th><th>ETTR</th><th>s.e.</th><th>interruptions</th><th>MTTF h</th>
<th>ckpt interval min</th><th>hot spares</th></tr>{rows}</table>
<h2>ETTR</h2><img src="ettr.png" alt="ETTR by policy">
<h2>Badput</h2><img src="badput.png" alt="badput by policy">
{'<h2>Checkpoint interval</h2><img src="interval.png" alt="ETTR against checkpoint interval">' if sweep else ''}
</body></html>"""
    (out / "index.html").write_text(page, encoding="utf-8")
    (out / "summary.json").write_text(json.dumps([s.to_json() for s in summaries], indent=1), encoding="utf-8")
    return out / "index.html"
