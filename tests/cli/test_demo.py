"""assay demo: a small configuration end to end, and the demo's own soundness cross-check.

The whole tour runs once per module (``tour``, ``--json``: every section with a small verify
configuration); the tests assert on that one output, print its sections as the table output
does, and run only cheap sections again where the command's own choices are tested.
"""

from __future__ import annotations

import io
import json
import re

import pytest
from rich.console import Console
from typer.testing import CliRunner

from assay.cli.demo_cmd import DEMO_SECTIONS
from assay.cli.main import app
from assay.demo import run_demo
from assay.errors import OptionError

IMAGES = 10


@pytest.fixture(scope="module")
def tour() -> dict:
    """``assay demo --json`` with every section: two radii, IBP, CROWN and α-CROWN on 10 images, two online steps."""
    result = CliRunner().invoke(app, ["demo", "--epsilons", "0.01,0.1", "--images", str(IMAGES), "--methods",
                                      "ibp,crown,alpha", "--online-steps", "2", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_demo_small_configuration_json(tour):
    online = tour["online"]
    assert [row["step"] for row in online["steps"]] == [0, 1, 2]
    assert online["steps"][1]["epsilon"] == pytest.approx(online["epsilon"] + online["growth"])
    for row in online["steps"]:  # reuse changes the work, never the verdict (both runs are sound and complete here)
        assert row["online"]["status"] == row["scratch"]["status"] == "holds"
    assert online["online_update_seconds"] > 0 and online["scratch_update_seconds"] > 0
    assert tour["test_accuracy"] > 0.9 and tour["images"] == IMAGES
    rows = {(row["epsilon"], row["method"]): row for row in tour["rows"]}
    assert set(rows) == {(e, m) for e in (0.01, 0.1) for m in ("ibp", "crown", "alpha", "pgd")}
    for epsilon in (0.01, 0.1):
        # CROWN is never looser than IBP (it keeps the tighter of the two per row).
        assert rows[epsilon, "crown"]["certified"] >= rows[epsilon, "ibp"]["certified"]
        for method in ("crown", "alpha"):
            assert rows[epsilon, method]["certified"] + rows[epsilon, "pgd"]["falsified"] <= IMAGES
    assert rows[0.01, "crown"]["certified"] >= rows[0.1, "crown"]["certified"]
    # run_demo raises on an image both certified and falsified: at ε = 0.1 both happen, so the check ran.
    assert rows[0.1, "crown"]["certified"] > 0 and rows[0.1, "pgd"]["falsified"] > 0


def test_demo_general_section_bounds_contain_the_samples_and_its_verdicts_match_them(tour):
    import torch

    from assay.verify.general_demo import control_policy

    data = tour["general"]
    assert {"Sin", "Cos", "Tanh", "Sigmoid", "Mul"} <= set(data["operators"])
    sampled = data["sampled"]
    for method, bounds in data["bounds"].items():
        assert bounds["lower"] <= sampled["min"] and bounds["upper"] >= sampled["max"], method
    # tighter methods are tighter here: CROWN within IBP's interval, α-CROWN within CROWN's
    assert data["bounds"]["crown"]["upper"] <= data["bounds"]["ibp"]["upper"]
    assert data["bounds"]["alpha"]["upper"] <= data["bounds"]["crown"]["upper"]
    above, below = data["verdicts"]
    assert above["threshold"] > sampled["max"] > below["threshold"]
    assert above["status"] == "holds" and below["status"] == "violated"
    point = torch.tensor(below["counterexample"]["input"], dtype=torch.float64).reshape(1, 2)
    assert float(control_policy().forward(point)) >= below["threshold"]


def test_demo_table(tour):
    """Every section's printer (what the table output shows) on the tour's results."""
    names = [section.name for section in DEMO_SECTIONS]
    results = {name: tour[name] for name in names if name != "verify"}
    results["verify"] = {key: value for key, value in tour.items() if key not in names}
    buffer = io.StringIO()
    out = Console(file=buffer, width=80, highlight=False)
    for section in DEMO_SECTIONS:
        section.show(out, results[section.name])
    output = buffer.getvalue()
    for text in ("IBP", "CROWN", "α-CROWN", "PGD attack", "certified", "falsified", "test accuracy", "KNN fairness",
                 "Monitoring", "Preimage approximation"):
        assert text in output
    text = " ".join(output.split())
    for fragment in ("Online verification", "from scratch", "reusing leaves vs"):
        assert fragment in text
    assert re.search(r"\d\.\d× (faster|slower)", text)
    assert len([line for line in output.splitlines() if line.split()[:1] in (["0"], ["1"], ["2"])]) == 3


def test_demo_online_steps_zero_skips_the_section(invoke):
    skipped = invoke("demo", "--online-steps", 0, "--sections", "online,cfx")
    assert skipped.exit_code == 0 and "Online verification" not in skipped.stdout and "Robust counterfactuals" in skipped.stdout


def test_run_demo_certified_and_falsified_are_disjoint():
    # run_demo raises on overlap; a radius where both happen on more images than the tour's exercises the check.
    result = run_demo(epsilons=(0.05,), images=30, methods=("crown",), attack_steps=20, attack_restarts=2)
    crown, attack = result.rows
    assert crown.certified > 0 and attack.falsified > 0
    assert crown.certified + attack.falsified <= 30


def test_demo_bad_options(invoke):
    result = invoke("demo", "--epsilons", "wide")
    assert result.exit_code == 2 and "--epsilons" in result.stderr
    result = invoke("demo", "--online-steps", -1)
    assert result.exit_code == 2 and "--online-steps must be ≥ 0" in result.stderr
    with pytest.raises(OptionError, match="methods"):
        run_demo(methods=("exact",))


def test_demo_monitor_and_knn_sections(tour):
    monitor = tour["monitor"]
    pair = monitor["closest_pair"]
    first, second = pair["inputs"]
    # The reported pair is a real witness: within ε in L∞, with different decisions.
    assert max(abs(a - b) for a, b in zip(first, second)) == pytest.approx(pair["distance"])
    assert pair["distance"] <= monitor["epsilon"] and pair["decisions"][0] != pair["decisions"][1]
    assert 0 < monitor["flagged"] <= monitor["pairs"]
    knn = tour["knn"]
    assert sum(knn["counts"].values()) == knn["inputs"]
    example = knn["counterexample"]
    assert example is not None and example["decision"] != example["prediction"]
    assert 1 <= len(example["flipped_rows"]) <= knn["flips"]


def test_demo_section_choice(invoke):
    listed = invoke("demo", "--sections", "list")
    assert listed.exit_code == 0 and listed.stdout.split() == ["verify", "general", "online", "preimage", "cfx", "monitor", "serve", "knn"]
    result = invoke("demo", "--sections", "verify,nope")
    assert result.exit_code == 2 and "nope" in result.stderr and "choose from" in result.stderr
    text = invoke("demo", "--sections", "knn")
    assert text.exit_code == 0 and "KNN fairness" in text.stdout and "L∞ robustness" not in text.stdout
    chosen = invoke("demo", "--sections", "cfx", "--json")  # only the chosen section: not even the verify keys
    assert chosen.exit_code == 0 and set(json.loads(chosen.stdout)) == {"cfx"}


def test_demo_preimage_section(tour):
    data = tour["preimage"]
    assert data["status"] == "reached" and data["ratio"] >= data["threshold"]
    assert data["checked_violations"] == 0 and data["checked_contained"] > 0
    assert 0 < data["covered_share"] <= data["preimage_share"] + 0.05
