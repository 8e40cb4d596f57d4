"""A self-contained HTML summary of a monitoring run: counts, latency percentiles and histogram, top flagged decisions.

One file, no external assets and no plotting dependency: the latency histogram is inline SVG.
Used by ``assay monitor --report report.html``; :func:`write_report` takes the CLI's summary
dict, the per-decision latencies (seconds) and the most-flagged decisions.
"""

from __future__ import annotations

import html
import math
from pathlib import Path

import numpy as np

__all__ = ["write_report", "render_report"]

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:960px;color:#1f2328}
h1{font-size:1.5rem}h2{font-size:1.15rem;margin-top:2rem}
table{border-collapse:collapse;margin:.5rem 0}td,th{border:1px solid #d0d7de;padding:.3rem .6rem;text-align:right}
th{background:#f6f8fa}td.l,th.l{text-align:left}.muted{color:#57606a;font-size:.9rem}
.cards{display:flex;gap:1rem;flex-wrap:wrap}.card{border:1px solid #d0d7de;border-radius:6px;padding:.6rem 1rem;min-width:9rem}
.card b{display:block;font-size:1.4rem}
"""


def _histogram_svg(latencies_ms: np.ndarray, bins: int = 40, width: int = 880, height: int = 220) -> str:
    """Inline SVG bar chart of the latencies on a log₁₀ axis (latencies span orders of magnitude)."""
    values = latencies_ms[latencies_ms > 0]
    if not values.size:
        return "<p class='muted'>no latencies recorded</p>"
    low, high = math.log10(values.min()), math.log10(values.max())
    if high - low < 1e-9:
        high = low + 1.0
    counts, edges = np.histogram(np.log10(values), bins=bins, range=(low, high))
    top = max(int(counts.max()), 1)
    pad_left, pad_bottom = 50, 30
    plot_w, plot_h = width - pad_left - 10, height - pad_bottom - 10
    bar_w = plot_w / bins
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' role='img' "
             f"aria-label='histogram of per-decision latency'>"]
    for i, count in enumerate(counts):
        h = plot_h * count / top
        x = pad_left + i * bar_w
        title = f"{10 ** edges[i]:.4g}–{10 ** edges[i + 1]:.4g} ms: {int(count)} decisions"
        parts.append(f"<rect x='{x:.1f}' y='{10 + plot_h - h:.1f}' width='{max(bar_w - 1, 1):.1f}' height='{h:.1f}' "
                     f"fill='#0969da'><title>{html.escape(title)}</title></rect>")
    parts.append(f"<line x1='{pad_left}' y1='{10 + plot_h}' x2='{pad_left + plot_w}' y2='{10 + plot_h}' stroke='#57606a'/>")
    for exponent in range(math.floor(low), math.ceil(high) + 1):
        if low <= exponent <= high:
            x = pad_left + plot_w * (exponent - low) / (high - low)
            parts.append(f"<line x1='{x:.1f}' y1='{10 + plot_h}' x2='{x:.1f}' y2='{14 + plot_h}' stroke='#57606a'/>"
                         f"<text x='{x:.1f}' y='{height - 8}' font-size='11' text-anchor='middle'>{10.0 ** exponent:g} ms</text>")
    parts.append(f"<text x='4' y='20' font-size='11'>{top}</text><text x='4' y='{10 + plot_h}' font-size='11'>0</text>")
    parts.append("</svg>")
    return "".join(parts)


def render_report(summary: dict, latencies_s: np.ndarray, top_flagged: list[dict]) -> str:
    """The report as an HTML string (see :func:`write_report`)."""
    latencies_ms = np.asarray(latencies_s, dtype=np.float64) * 1e3
    esc = html.escape
    cards = [("decisions", f"{summary['decisions']:,}"), ("violating pairs", f"{summary['pairs']:,}"),
             ("flagged decisions", f"{summary['flagged']:,}"),
             ("flagged share", f"{summary['flagged'] / summary['decisions']:.2%}" if summary["decisions"] else "—"),
             ("peak memory", f"{summary['peak_memory_mb']:.0f} MB")]
    rows = []
    if latencies_ms.size:
        for name, value in [("mean", latencies_ms.mean()), ("p50", np.percentile(latencies_ms, 50)),
                            ("p90", np.percentile(latencies_ms, 90)), ("p99", np.percentile(latencies_ms, 99)),
                            ("max", latencies_ms.max())]:
            rows.append(f"<tr><th class='l'>{name}</th><td>{value:.4f} ms</td></tr>")
    flagged_rows = []
    for record in top_flagged:
        shown = ", ".join(str(i) for i in record["ids"][:10]) + (" …" if len(record["ids"]) > 10 or record["incomplete"] else "")
        nearest = f"{min(record['distances']):.6g}" if record["distances"] else "—"
        flagged_rows.append(f"<tr><td>{record['decision']}</td><td>{record.get('line', '—')}</td><td>{esc(str(record.get('decision_value', '')))}</td>"
                            f"<td>{record['count']}</td><td>{nearest}</td><td class='l'>{esc(shown)}</td></tr>")
    options = ", ".join(f"{k}={summary[k]}" for k in ("epsilon", "metric", "index", "batch_size") if k in summary)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>assay monitor report — {esc(str(summary.get('stream', '')))}</title>
<style>{_STYLE}</style></head><body>
<h1>assay monitor report</h1>
<p class="muted">stream {esc(str(summary.get('stream', '')))} · {esc(options)}{' · interrupted' if summary.get('interrupted') else ''}
· {summary.get('seconds', 0):.2f} s</p>
<p>A decision is <i>flagged</i> when an earlier decision had an input within ε (d ≤ ε) and a different output; each such
(earlier, later) pair is a <i>violating pair</i>. Every count is exact.</p>
<div class="cards">{''.join(f"<div class='card'>{esc(label)}<b>{esc(value)}</b></div>" for label, value in cards)}</div>
<h2>Per-decision latency</h2>
<p class="muted">Wall-clock time of the monitor per decision{' (batch time divided by the batch size)' if summary.get('batch_size', 1) > 1 else ''}.</p>
<table>{''.join(rows)}</table>
{_histogram_svg(latencies_ms)}
<h2>Most-witnessed flagged decisions</h2>
{'<p class="muted">no decision was flagged</p>' if not flagged_rows else
 "<table><tr><th>decision</th><th>line</th><th>output</th><th>witnesses</th><th>nearest d</th><th class='l'>witness ids</th></tr>"
 + ''.join(flagged_rows) + "</table>"}
</body></html>
"""


def write_report(path, summary: dict, latencies_s: np.ndarray, top_flagged: list[dict]) -> Path:
    """Write the HTML report of a run to ``path``; return the path.

    ``summary`` needs the keys ``decisions``, ``pairs``, ``flagged`` and ``peak_memory_mb`` (others
    shown when present); ``top_flagged`` holds records with ``decision``, ``count``, ``ids``,
    ``distances``, ``incomplete`` and optionally ``line`` and ``decision_value``.
    """
    path = Path(path)
    path.write_text(render_report(summary, latencies_s, top_flagged), encoding="utf-8")
    return path
