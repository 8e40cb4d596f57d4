"""The browser dashboard: server-rendered HTML pages (Jinja2 templates, autoescaped) over the hub.

``/`` lists the monitors with their counts; ``/monitors/{name}`` shows one monitor: live counts
(a few lines of JavaScript poll ``/api/monitors/{name}/stats``), a plot of flagged decisions
over time (inline SVG, drawn here), and the latest flagged decisions, each beside its nearest
witness with the features that differ highlighted, or drawn as two images when the monitor has
an ``image_shape``. Labels and feature names are user data: autoescaping keeps them text. The
header names the monitor shown, never the store (its path on the server's disk is not the
viewers' business).
"""

from __future__ import annotations

import math
import time
from datetime import datetime, timezone

import numpy as np
from jinja2 import Environment, PackageLoader, select_autoescape

from assay.serve.hub import MonitorHub

__all__ = ["render_index", "render_monitor", "render_login", "PAGE_SIZE", "MAX_FEATURE_ROWS"]

#: Flagged decisions per dashboard page.
PAGE_SIZE = 12
#: Features listed per pair (the most different first when there are more).
MAX_FEATURE_ROWS = 24

_environment = Environment(loader=PackageLoader("assay.serve", "templates"), autoescape=select_autoescape(["html"]))


def _clock(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _short_clock(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%H:%M:%S")


def render_login(failed: bool) -> str:
    return _environment.get_template("login.html").render(failed=failed)


def render_index(hub: MonitorHub) -> str:
    monitors = [{"spec": hub.spec(name), "stats": hub.stats(name)} for name in hub.names()]
    return _environment.get_template("index.html").render(monitors=monitors)


def _pair(hub: MonitorHub, name: str, record: dict, spec) -> dict:
    """A flagged decision beside its nearest witness (smallest distance, then smallest id)."""
    store = hub.store
    mine = store.decision(name, record["decision"])
    pair = {"record": record, "when": _clock(record["received"]), "witness": None}
    if mine is None or not record["ids"]:
        pair["x"], pair["y"] = (None, None) if mine is None else (mine[0], mine[1])
        return pair
    x, y, _ = mine
    nearest = int(np.lexsort((np.asarray(record["ids"]), np.asarray(record["distances"])))[0])
    witness_id = record["ids"][nearest]
    other = store.decision(name, witness_id)
    pair.update(x=x, y=y, witness_id=witness_id, distance=record["distances"][nearest])
    if other is None:
        return pair
    wx, wy, _ = other
    pair["witness"] = {"x": wx, "y": wy}
    names = list(spec.features) if spec.features else [f"x{i}" for i in range(x.size)]
    differences = np.abs(x - wx)
    largest = float(differences.max()) if differences.size else 0.0
    order = np.argsort(-differences, kind="stable")[:MAX_FEATURE_ROWS] if x.size > MAX_FEATURE_ROWS else np.arange(x.size)
    pair["rows"] = [{"name": names[i], "mine": _number(x[i]), "theirs": _number(wx[i]), "differs": bool(differences[i] > 0),
                     "strength": float(differences[i] / largest) if largest > 0 else 0.0} for i in order]
    pair["hidden_rows"] = max(0, x.size - len(order))
    pair["differing"] = int(np.count_nonzero(differences))
    if spec.image_shape is not None:
        pair["image"] = {"shape": list(spec.image_shape), "mine": x.tolist(), "theirs": wx.tolist(),
                         "low": float(min(x.min(), wx.min())), "high": float(max(x.max(), wx.max())),
                         "difference": differences.tolist(), "largest": largest}
    return pair


def _number(value: float) -> str:
    return f"{value:.6g}"


def _plot(hub: MonitorHub, name: str, bins: int = 48) -> dict:
    """Bars of flagged decisions per time bin, from the first decision until now, as SVG geometry."""
    first = hub.store.first_received(name)
    now = time.time()
    width, height = 720, 150
    if first is None:
        return {"bars": [], "width": width, "height": height, "empty": True, "labels": [], "peak": 0}
    span = max(now - first, 1.0)
    counts = hub.store.violation_histogram(name, first, span / bins, bins)
    edges = first + np.arange(bins + 1) * (span / bins)
    peak = int(counts.max()) if counts.size else 0
    scale = (height - 24) / max(peak, 1)
    step = width / bins
    bars = [{"x": round(i * step + 1, 1), "w": round(step - 2, 1), "h": round(c * scale, 1),
             "y": round(height - 18 - c * scale, 1), "count": int(c), "from": _short_clock(edges[i]),
             "to": _short_clock(edges[i + 1])} for i, c in enumerate(counts)]
    labels = [{"x": round(i * width / 4, 1), "text": _short_clock(first + i * span / 4),
               "anchor": "start" if i == 0 else ("end" if i == 4 else "middle")} for i in range(5)]
    return {"bars": bars, "width": width, "height": height, "empty": False, "labels": labels, "peak": peak,
            "peak_label": f"{peak:,} per {_duration(span / bins)}"}


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def render_monitor(hub: MonitorHub, name: str, before_id: int | None = None) -> str:
    spec = hub.spec(name)
    stats = hub.stats(name)
    records = hub.store.violations(name, before_id=before_id, limit=PAGE_SIZE, newest_first=True)
    pairs = [_pair(hub, name, record, spec) for record in records]
    older = records[-1]["decision"] if len(records) == PAGE_SIZE else None
    rate = stats.flagged / stats.decisions if stats.decisions else 0.0
    return _environment.get_template("monitor.html").render(
        spec=spec, stats=stats, pairs=pairs, plot=_plot(hub, name), heading=name, older=older,
        before_id=before_id, rate=f"{100 * rate:.2f}" if not math.isnan(rate) else "0",
    )
