"""The batch worker reads gzipped models and properties through assay.nn.load and assay.sets.read_vnnlib."""

from __future__ import annotations

import gzip

import assay.run.vnncomp as vnncomp
from assay.run.vnncomp import Instance, verify_instance
from tests.cli.models import holding_property, violated_property, write_tiny_onnx


def gzipped(path):
    target = path.with_name(path.name + ".gz")
    target.write_bytes(gzip.compress(path.read_bytes()))
    return target


def instance(network, prop):
    return Instance(network.name, prop.name, 30.0, network, prop, 1)


def test_public_names():
    assert vnncomp.__all__ == ["Instance", "read_instances", "read_instance_rows", "verify_instance", "write_results",
                               "summarize", "STATUSES", "RESULT_COLUMNS"]


def test_gzipped_model_and_properties_give_the_verdicts_of_the_plain_files(tmp_path):
    model = write_tiny_onnx(tmp_path / "tiny.onnx")
    holds, violated = holding_property(tmp_path / "holds.vnnlib"), violated_property(tmp_path / "violated.vnnlib")
    for network in (model, gzipped(model)):
        for prop, status in ((holds, "holds"), (violated, "violated"), (gzipped(holds), "holds"), (gzipped(violated), "violated")):
            row = verify_instance(instance(network, prop))
            assert row["status"] == status and row["error"] is None, (network.name, prop.name, row)


def test_a_damaged_gzip_is_an_error_row_naming_the_file(tmp_path):
    model = write_tiny_onnx(tmp_path / "tiny.onnx")
    prop = holding_property(tmp_path / "holds.vnnlib")
    broken_model = tmp_path / "broken.onnx.gz"
    broken_model.write_bytes(b"not gzip")
    row = verify_instance(instance(broken_model, prop))
    assert row["status"] == "error" and "broken.onnx.gz" in row["error"]
    broken_prop = tmp_path / "broken.vnnlib.gz"
    broken_prop.write_bytes(gzip.compress(prop.read_bytes())[:20])
    row = verify_instance(instance(model, broken_prop))
    assert row["status"] == "error" and "broken.vnnlib.gz" in row["error"]
