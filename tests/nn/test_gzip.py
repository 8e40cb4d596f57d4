"""`assay.nn.load` reads gzipped model files (``.onnx.gz``, ``.nnet.gz``) as the plain ones, in memory."""

from __future__ import annotations

import gzip

import pytest
import torch

from assay.errors import ModelLoadError
from assay.nn import load
from assay.nn.load import nnet_input_bounds
from tests.cli.models import write_tiny_onnx
from tests.nn.test_formats import write_nnet


def gzipped(path, suffix=".gz"):
    target = path.with_name(path.name + suffix)
    target.write_bytes(gzip.compress(path.read_bytes()))
    return target


def assert_same_network(a, b, inputs):
    assert a.input_shape == b.input_shape and a.output_shape == b.output_shape
    assert [type(layer) for layer in a.layers] == [type(layer) for layer in b.layers]
    assert torch.equal(a.forward(inputs), b.forward(inputs))


def test_gzipped_onnx_loads_as_the_plain_file(tmp_path):
    plain = write_tiny_onnx(tmp_path / "tiny.onnx")
    packed = gzipped(plain)
    network = load(packed)
    assert network.source == str(packed)  # the file given, not a temporary copy
    assert_same_network(network, load(plain), torch.rand(16, 2, dtype=torch.float64))
    assert not list(tmp_path.glob("assay-*"))


def test_gzipped_nnet_loads_as_the_plain_file_and_keeps_its_input_box(tmp_path, rng):
    plain = tmp_path / "tiny.nnet"
    write_nnet(plain, rng.normal(size=(4, 3)), rng.normal(size=4), rng.normal(size=(2, 4)), rng.normal(size=2))
    packed = gzipped(plain, ".GZ")  # suffixes are matched in any case
    assert_same_network(load(packed), load(plain), torch.rand(16, 3, dtype=torch.float64))
    for got, expected in zip(nnet_input_bounds(packed), nnet_input_bounds(plain)):
        assert got.tolist() == expected.tolist()


@pytest.mark.parametrize("name", ["model.onnx.gz", "model.nnet.gz"])
def test_a_damaged_archive_is_a_model_load_error_naming_the_file(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(gzip.compress(b"0123456789" * 100)[:40])
    with pytest.raises(ModelLoadError, match=name):
        load(path)
    path.write_bytes(b"not gzip at all")
    with pytest.raises(ModelLoadError, match=name):
        load(path)


def test_missing_gzipped_files_and_unknown_inner_formats(tmp_path):
    with pytest.raises(ModelLoadError, match="no such file"):
        load(tmp_path / "absent.onnx.gz")
    with pytest.raises(ModelLoadError, match="no such file"):
        load(tmp_path / "absent.nnet.gz")
    other = tmp_path / "model.h5.gz"
    other.write_bytes(gzip.compress(b"\x89HDF"))
    with pytest.raises(ModelLoadError, match="unknown model format"):
        load(other)
