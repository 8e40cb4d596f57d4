"""``assay knn-fairness`` end to end through a bare typer app (the main CLI registers the same function)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from assay.cli._common import handle_errors
from assay.cli.knn_cmd import knn_fairness

app = typer.Typer()
app.command()(handle_errors(knn_fairness))
runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture
def files(tmp_path, rng):
    X = rng.integers(0, 4, size=(40, 3)).astype(float)
    sex = rng.integers(0, 2, 40)
    y = np.where(X[:, 1] + X[:, 2] + rng.normal(0, 0.5, 40) > 3, "yes", "no")
    lines = ["sex,age,score,hours,outcome"] + [f"{s},{a},{b},{c},{o}" for s, (a, b, c), o in zip(sex, X, y)]
    train = tmp_path / "train.csv"
    train.write_text("\n".join(lines) + "\n")
    test = tmp_path / "test.csv"
    test.write_text("sex,age,score,hours\n1,1,2,2\n0,3,3,1\n1,0,0,1\n")
    return train, test


def test_json_summary_and_certificates(files):
    train, test = files
    result = run(train, "--label", "outcome", "--protected", "sex", "--flips", 1, "--epsilon", "hours=5%",
                 "--test", test, "--k", "3,5,7", "--folds", 5, "--json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    summary = payload["summary"]
    assert summary["inputs"] == 3 and summary["certified"] + summary["unknown"] + summary["falsified"] == 3
    assert {"seconds_per_input_median", "setup_seconds", "k_default", "certified_percent"} <= set(summary)
    assert payload["labels"] == ["no", "yes"]
    assert len(payload["certificates"]) == 3 and payload["certificates"][0]["protected"] == [0]
    assert list(payload["certificates"][0]["epsilon"]) == ["3"]


def test_human_summary_with_first(files):
    train, _ = files
    result = run(train, "--label", "outcome", "--flips", 1, "--first", 5, "--k", "3,5", "--folds", 5,
                 "--weights", "no=2,yes=1", "--down-sample", "--direction", "yes:no")
    assert result.exit_code == 0, result.output
    assert "certified" in result.stdout and "falsified" in result.stdout and "time per input" in result.stdout


@pytest.mark.parametrize("args, words", [
    (["--label", "missing", "--flips", 1], "no column 'missing'"),
    (["--label", "outcome", "--flips", 1, "--protected", "race"], "--protected names column 'race'"),
    (["--label", "outcome", "--flips", 1, "--epsilon", "hours"], "KEY=VALUE"),
    (["--label", "outcome", "--flips", 1, "--k", "3,500"], "must not exceed"),
    (["--label", "outcome", "--flips", 1, "--direction", "yes:maybe"], "labels are no, yes"),
])
def test_errors_exit_2_with_a_message(files, args, words):
    train, _ = files
    result = run(train, *args)
    assert result.exit_code == 2
    assert "error:" in result.stderr and words in result.stderr


def test_missing_test_column_names_the_file(files, tmp_path):
    train, _ = files
    bad = tmp_path / "bad.csv"
    bad.write_text("sex,age,score\n1,1,2\n")
    result = run(train, "--label", "outcome", "--flips", 1, "--test", bad)
    assert result.exit_code == 2 and "bad.csv" in result.stderr and "'hours'" in result.stderr


@pytest.mark.data
def test_authors_split(data_dir):
    split = data_dir / "knn" / "splits" / "salary-10.npy"
    result = run(split, "--flips", 1, "--protected", "0", "--k", "7,8,9,10,11", "--first", 101, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)["summary"]
    assert summary["inputs"] == 6 and summary["certified"] == 2 and summary["falsified"] == 4
