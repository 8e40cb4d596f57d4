"""The service stop of ``assay demo``: its numbers are the monitor's own, and it prints them."""

from __future__ import annotations

import numpy as np
from typer.testing import CliRunner

from assay.cli.main import app as cli
from assay.monitor import Monitor
from assay.serve import demo


def test_demo_section_serves_posts_and_restarts_with_the_monitors_answers():
    data = demo.demo_section(seed=3)
    rows = np.random.default_rng(3).random((demo._DECISIONS, len(demo._FEATURES))).round(3)
    labels = demo._decide(rows)
    reference = Monitor(demo._EPSILON).observe_batch(rows, labels)
    assert (data["decisions"], data["flagged"], data["pairs"]) == (2000, sum(w.flagged for w in reference),
                                                                   sum(w.count for w in reference))
    assert data["flagged"] > 0 and data["dashboard_status"] == 200 and data["url"].startswith("http://127.0.0.1:")
    assert {k: data["restart"][k] for k in ("decisions", "flagged", "pairs")} == {k: data[k] for k in ("decisions", "flagged", "pairs")}
    first = next(w for w in reference if w.flagged)
    earlier = int(first.ids[np.argmin(first.distances)])
    assert data["first_violation"]["ids"] == [earlier, first.decision]
    assert data["first_violation"]["decisions"] == [labels[earlier], labels[first.decision]]


def test_assay_demo_prints_the_service_section():
    result = CliRunner().invoke(cli, ["demo", "--sections", "serve"])
    assert result.exit_code == 0, result.output
    assert "As a service: `assay serve` ran at http://127.0.0.1:" in result.output
    assert "with the same counts" in result.output
