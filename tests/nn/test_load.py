"""`assay.nn.load` on the real networks (parity with onnxruntime) and on bad input (clear errors)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from assay.errors import ModelLoadError, UnsupportedOperatorError
from assay.nn import Linear, Network, ReLU, load

from .ort_reference import assert_matches_ort, ort_outputs

SAMPLES = 64


def data_models(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "acasxu").glob("*.onnx")) + sorted((data_dir / "premap").glob("*.onnx"))


@pytest.mark.data
def test_every_shared_onnx_model_matches_onnxruntime(data_dir, rng):
    """Float32 onnxruntime vs the Network in float64 and float32, and float64 onnxruntime vs float64.

    See :func:`assert_matches_ort` for the tolerances (VCAS outputs reach 100, where float32
    rounding alone exceeds a plain 1e-5 on outputs that cancel near 0).
    """
    paths = data_models(data_dir)
    assert len(list((data_dir / "acasxu").glob("*.onnx"))) == 45
    assert len(paths) > 45
    for path in paths:
        network = load(path)
        assert network.source == str(path)
        model = onnx.load(str(path))
        if path.name.startswith("model_auto_park"):
            # declared (batch, 2, 2) with MatMul on the last axis: a 2 -> 20 -> 4 network per row
            assert network.input_shape == (2,) and network.output_shape == (4,)
            x = rng.uniform(-1, 1, size=(SAMPLES, 2, 2)).astype(np.float32)
            assert ort_outputs(model, x).shape == (SAMPLES, 2, 4)
            assert_matches_ort(network, model, x, path.name, network_input=x.reshape(2 * SAMPLES, 2))
        else:
            x = rng.uniform(-1, 1, size=(SAMPLES, *network.input_shape)).astype(np.float32)
            assert_matches_ort(network, model, x, path.name)


@pytest.mark.data
def test_shared_models_have_the_documented_architectures(data_dir):
    acas = load(data_dir / "acasxu" / "ACASXU_run2a_1_1_batch_2000.onnx")
    assert acas.input_size == 5 and acas.output_shape == (5,)
    assert [type(layer).__name__ for layer in acas.layers].count("Linear") == 7
    assert acas.input_name == "input" and acas.output_name == "linear_7_Add"
    auto_park = load(str(data_dir / "premap" / "model_auto_park_auto_park_model_20.onnx"))
    assert [tuple(layer.weight.shape) for layer in auto_park.layers if isinstance(layer, Linear)] == [(20, 2), (4, 20)]
    vcas = load(data_dir / "premap" / "VCAS_21_VertCAS_1.onnx")
    assert vcas.input_shape == (4,) and vcas.output_shape == (9,)
    dubins = load(data_dir / "premap" / "dubinsrejoin.onnx")
    assert dubins.input_shape == (8,) and dubins.output_shape == (8,)


# ---------------------------------------------------------------------- errors and dispatch
def test_missing_file_is_a_model_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match="no such file") as info:
        load(tmp_path / "absent.onnx")
    assert "absent.onnx" in str(info.value)
    with pytest.raises(ModelLoadError, match="no such file"):
        load(tmp_path / "absent.nnet")


def test_garbled_onnx_file_is_a_model_load_error(tmp_path, rng):
    path = tmp_path / "garbled.onnx"
    path.write_bytes(rng.integers(0, 256, size=4096, dtype=np.uint8).tobytes())
    with pytest.raises(ModelLoadError) as info:
        load(path)
    assert not isinstance(info.value, UnsupportedOperatorError)
    assert "garbled.onnx" in str(info.value)
    assert info.value.__cause__ is not None


def test_empty_onnx_file_is_a_model_load_error(tmp_path):
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="empty.onnx"):
        load(path)


def test_unknown_suffix_lists_the_supported_formats(tmp_path):
    path = tmp_path / "model.h5"
    path.write_bytes(b"\x89HDF")
    with pytest.raises(ModelLoadError) as info:
        load(path)
    message = str(info.value)
    assert "model.h5" in message and ".onnx" in message and ".nnet" in message and "torch" in message


def test_unknown_object_is_a_model_load_error():
    with pytest.raises(ModelLoadError, match="cannot load a builtins.dict"):
        load({"weights": [1, 2]})


def test_a_network_passes_through():
    network = Network((Linear(torch.ones(2, 3), torch.zeros(2)), ReLU()), (3,))
    assert load(network) is network
    with pytest.raises(ModelLoadError, match="input_shape"):
        load(network, input_shape=(4,))


@pytest.mark.parametrize("bad", [5, (0, 3), (2.5,), "5", ()])
def test_input_shape_must_be_a_tuple_of_positive_ints(bad):
    from assay.errors import OptionError

    with pytest.raises(OptionError, match="input_shape"):
        load(torch.nn.Sequential(torch.nn.Linear(5, 2)), input_shape=bad)
