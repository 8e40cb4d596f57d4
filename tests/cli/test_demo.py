"""assay demo: a small configuration end to end, and the demo's own soundness cross-check."""

from __future__ import annotations

import json
import re

import pytest

from assay.demo import run_demo
from assay.errors import OptionError


def test_demo_small_configuration_json(invoke):
    result = invoke("demo", "--epsilons", "0.01,0.1", "--images", 10, "--methods", "ibp,crown", "--online-steps", 1,
                    "--json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    online = payload["online"]
    assert [row["step"] for row in online["steps"]] == [0, 1]
    assert online["steps"][1]["epsilon"] == pytest.approx(online["epsilon"] + online["growth"])
    for row in online["steps"]:  # reuse changes the work, never the verdict (both runs are sound and complete here)
        assert row["online"]["status"] == row["scratch"]["status"] == "holds"
    assert online["online_update_seconds"] > 0 and online["scratch_update_seconds"] > 0
    assert payload["test_accuracy"] > 0.9 and payload["images"] == 10
    rows = {(row["epsilon"], row["method"]): row for row in payload["rows"]}
    assert set(rows) == {(e, m) for e in (0.01, 0.1) for m in ("ibp", "crown", "pgd")}
    for epsilon in (0.01, 0.1):
        # CROWN is never looser than IBP (it keeps the tighter of the two per row).
        assert rows[epsilon, "crown"]["certified"] >= rows[epsilon, "ibp"]["certified"]
        assert rows[epsilon, "crown"]["certified"] + rows[epsilon, "pgd"]["falsified"] <= 10
    assert rows[0.01, "crown"]["certified"] >= rows[0.1, "crown"]["certified"]


def test_demo_table(invoke):
    result = invoke("demo", "--epsilons", "0.05", "--images", 5, "--methods", "crown,alpha", "--online-steps", 2)
    assert result.exit_code == 0, result.output
    for text in ("CROWN", "α-CROWN", "PGD attack", "certified", "falsified", "test accuracy"):
        assert text in result.stdout
    text = " ".join(result.stdout.split())
    for fragment in ("Online verification", "from scratch", "reusing leaves vs"):
        assert fragment in text
    assert re.search(r"\d\.\d× (faster|slower)", text)
    assert len([line for line in result.stdout.splitlines() if line.split()[:1] in (["0"], ["1"], ["2"])]) == 3
    skipped = invoke("demo", "--epsilons", "0.05", "--images", 2, "--methods", "ibp", "--online-steps", 0)
    assert skipped.exit_code == 0 and "Online verification" not in skipped.stdout


def test_run_demo_certified_and_falsified_are_disjoint():
    # run_demo raises on overlap; a radius where both happen exercises the check.
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


def test_demo_sections_monitor_and_knn(invoke):
    result = invoke("demo", "--sections", "monitor,knn", "--json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert set(payload) == {"monitor", "knn"}
    monitor = payload["monitor"]
    pair = monitor["closest_pair"]
    first, second = pair["inputs"]
    # The reported pair is a real witness: within ε in L∞, with different decisions.
    assert max(abs(a - b) for a, b in zip(first, second)) == pytest.approx(pair["distance"])
    assert pair["distance"] <= monitor["epsilon"] and pair["decisions"][0] != pair["decisions"][1]
    assert 0 < monitor["flagged"] <= monitor["pairs"]
    knn = payload["knn"]
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


def test_demo_preimage_section(invoke):
    result = invoke("demo", "--sections", "preimage", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)["preimage"]
    assert data["status"] == "reached" and data["ratio"] >= data["threshold"]
    assert data["checked_violations"] == 0 and data["checked_contained"] > 0
    assert 0 < data["covered_share"] <= data["preimage_share"] + 0.05
