"""``assay cfx`` end to end, the demo section, and the Table 1 data sets (with the data folder)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from assay.cfx.demo import demo_network, demo_section
from assay.cfx.explain import write_onnx
from assay.cli.main import app


@pytest.fixture
def invoke():
    runner = CliRunner()
    return lambda *args: runner.invoke(app, [str(a) for a in args])


@pytest.fixture
def loan(tmp_path):
    model = write_onnx(demo_network(), tmp_path / "loan.onnx")
    x = tmp_path / "x.json"
    x.write_text("[0.35, 0.5, 0.2]")
    return model, x, tmp_path


def test_cfx_command_plain_robust_and_apas(invoke, loan):
    model, x, _ = loan
    plain = invoke("cfx", model, "--input", x, "--delta", "0.05")
    assert plain.exit_code == 0, plain.output
    assert "class 1 reached" in plain.stdout and "x[0]: 0.35 → 0.6" in plain.stdout
    assert "not robust" in plain.stdout
    robust = invoke("cfx", model, "--input", x, "--robust", "--delta", "0.05", "--json")
    payload = json.loads(robust.stdout)["results"][0]
    assert payload["robust"]["robust"] and payload["robust"]["test"] == "exact"
    assert payload["counterfactual"]["x_cf"][0] == pytest.approx(0.7367, abs=1e-3)
    direct = json.loads(invoke("cfx", model, "--input", x, "--robust", "--delta", "0.05", "--direct", "--json").stdout)
    nearest = direct["results"][0]
    assert nearest["robust"]["robust"] and nearest["robust"]["candidates"] == 1
    assert nearest["counterfactual"]["distance"] < payload["counterfactual"]["distance"]  # nearer than MILP-R's
    assert invoke("cfx", model, "--input", x, "--direct").exit_code == 2
    apas = invoke("cfx", model, "--input", x, "--apas", "--json")
    result = json.loads(apas.stdout)["results"][0]["apas"]
    assert result["samples"] == 1379 and result["delta"] >= 0
    assert "(≥ 0.999)" in result["guarantee"]


def test_cfx_samples_option_sets_n_and_states_the_confidence_it_buys(invoke, loan):
    model, x, _ = loan
    more = json.loads(invoke("cfx", model, "--input", x, "--apas", "--samples", "10000", "--json").stdout)
    more = more["results"][0]["apas"]
    assert more["samples"] == 10000 and more["confidence"] == pytest.approx(1 - 0.995 ** 10000)
    few = json.loads(invoke("cfx", model, "--input", x, "--apas", "--samples", "100", "--json").stdout)
    few = few["results"][0]["apas"]
    # 100 samples buy confidence 1 − 0.995¹⁰⁰ ≈ 0.39: the guarantee must not claim α = 0.999.
    assert few["samples"] == 100 and few["confidence"] == pytest.approx(1 - 0.995 ** 100)
    assert "≥ 0.999" not in few["guarantee"] and "below the requested 0.999" in few["guarantee"]
    robust = json.loads(invoke("cfx", model, "--input", x, "--robust", "--delta", "0.05", "--apas", "--samples", "2000",
                               "--json").stdout)["results"][0]["robust"]
    assert robust["test"] == "apas" and robust["robust"] and "fresh sample of 2000" in robust["guarantee"]
    assert robust["confidence"] == pytest.approx(1 - robust["tested"] * 0.995 ** 2000)
    for args, message in ((("--samples", "0", "--apas"), "≥ 1"), (("--samples", "50"), "needs --apas")):
        bad = invoke("cfx", model, "--input", x, *args)
        assert bad.exit_code == 2 and message in bad.stderr


def test_cfx_command_batch_infeasible_and_errors(invoke, loan):
    model, _, folder = loan
    rows = folder / "rows.csv"
    rows.write_text("income,debt,years_employed\n0.35,0.5,0.2\n0.1,0.9,0.1\n")
    spec = folder / "spec.json"
    spec.write_text(json.dumps({"size": 3, "immutable": [0, 1, 2], "names": ["income", "debt", "years_employed"]}))
    batch = invoke("cfx", model, "--inputs", rows, "--features", spec)
    assert batch.exit_code == 0, batch.output
    assert batch.stdout.count("no counterfactual") == 2 and "immutable" in batch.stdout
    assert "0/2 inputs have a counterfactual" in batch.stdout
    missing = invoke("cfx", model, "--inputs", rows, "--robust")
    assert missing.exit_code == 2 and "--delta" in missing.stderr
    both = invoke("cfx", model)
    assert both.exit_code == 2 and "exactly one" in both.stderr
    wrong = folder / "wrong.json"
    wrong.write_text("[0.1, 0.2]")
    bad = invoke("cfx", model, "--input", wrong)
    assert bad.exit_code == 2 and "3 values" in bad.stderr


def test_demo_section_is_deterministic_and_honest():
    first, second = demo_section(), demo_section()
    assert first == second
    json.dumps(first)
    assert first["plain"]["robust_after_shift"] == "not_robust" and first["plain"]["shifted_logit"] <= 0
    assert first["robust"]["proven"] and first["robust"]["cost"] > first["plain"]["cost"]
    assert first["exact_delta"] >= first["delta"]


@pytest.mark.data
def test_table1_data_sets_load_with_the_published_shapes(data_dir):
    from assay.cfx.data import load_dataset

    expected = {"diabetes": (384, 8), "no2": (250, 7), "sba": (1159, 9), "credit": (1000, 72)}
    for name, shape in expected.items():
        dataset = load_dataset(name, data_dir)
        assert dataset.X1.shape == shape
        assert dataset.X2.shape[1] == shape[1] and len(dataset.X2) > 0
        assert set(np.unique(dataset.y1)) == {0, 1}
        for X in (dataset.X1, dataset.X2):
            assert X.min() >= 0 and X.max() <= 1
        assert all(dataset.features.violations(row) == [] for row in dataset.X1[:200])
    credit = load_dataset("credit", data_dir)
    assert len(credit.features.one_hot) == 6 and len(credit.features.ordinal) == 11
    assert sum(len(g) for g in credit.features.groups) == 69
