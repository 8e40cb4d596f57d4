"""General ONNX graphs (issue 32, loading): every operator of assay.nn.ops loads and computes
what onnxruntime computes; the batch dimension is never mixed; bound methods refuse what they
have no rule for in one line; the vnncomp2024 networks match onnxruntime."""

from __future__ import annotations

import gzip
import inspect
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from assay.bounds import compute_bounds
from assay.errors import UnsupportedOperatorError
from assay.nn import load
from assay.nn.ops import Sigmoid
from assay.nn.reference import deviation_from_onnxruntime
from assay.sets import read_vnnlib

from .test_onnx import GraphMaker

TOLERANCE = 1e-5


def _unary(op, **attrs):
    return lambda g: g.node(op, ["x"], **attrs)


CASES = {  # name → builder of the graph on x of shape (N, 3, 4) (inputs in [0.5, 2]: Log, Sqrt are defined)
    **{op: _unary(op) for op in ("Sigmoid", "Tanh", "Exp", "Log", "Reciprocal", "Sqrt", "Sin", "Cos", "Abs", "Neg")},
    "Sign": lambda g: g.node("Sign", [g.node("Sub", ["x", g.const(1.0)])]),
    "Floor": lambda g: g.node("Floor", [g.node("Mul", ["x", g.const(3.0)])]),
    "LeakyRelu": lambda g: g.node("LeakyRelu", [g.node("Sub", ["x", g.const(1.2)])], alpha=0.2),
    "Clip": lambda g: g.node("Clip", ["x", g.const(0.8), g.const(1.5)]),
    "Pow": lambda g: g.node("Pow", ["x", g.const(3.0)]),
    "Softmax": lambda g: g.node("Softmax", ["x"], axis=-1),
    "Transpose": lambda g: g.node("Transpose", ["x"], perm=[0, 2, 1]),
    "Slice": lambda g: g.node("Slice", ["x", g.const([1], np.int64), g.const([3], np.int64), g.const([2], np.int64)]),
    "Gather": lambda g: g.node("Gather", ["x", g.const([2, 0, -1], np.int64)], axis=1),
    "Concat": lambda g: g.node("Concat", ["x", g.node("Sigmoid", ["x"])], axis=2),
    "Split+Mul (broadcast)": lambda g: _split_mul(g),
    "ReduceSum": lambda g: g.node("ReduceSum", ["x", g.const([2], np.int64)], keepdims=0),
    "ReduceMean": lambda g: g.node("ReduceMean", ["x"], axes=[1], keepdims=1),
    "MatMul of two tensors": lambda g: g.node("MatMul", ["x", g.node("Transpose", ["x"], perm=[0, 2, 1])]),
    "Div of two tensors": lambda g: g.node("Div", ["x", g.node("Exp", ["x"])]),
    "Max, Min": lambda g: g.node("Min", [g.node("Max", ["x", g.node("Sin", ["x"])]), g.random(4)]),
    "constant / x": lambda g: g.node("Div", [g.const(2.0), "x"]),
    "MatMul with a constant on the left": lambda g: g.node("MatMul", [g.random(5, 3), "x"]),
    "Reshape": lambda g: g.node("Reshape", ["x", g.const([-1, 4, 3], np.int64)]),
    "Unsqueeze, Squeeze": lambda g: g.node("Squeeze", [g.node("Unsqueeze", ["x", g.const([2], np.int64)]),
                                                       g.const([2], np.int64)]),
    "Pad": lambda g: g.node("Pad", ["x", g.const([0, 1, 0, 0, 0, 2], np.int64), g.const(0.5)]),
}
IMAGE_CASES = {  # on x of shape (N, 2, 3, 3)
    "ConvTranspose": lambda g: g.node("ConvTranspose", ["x", g.random(2, 3, 3, 3), g.random(3)], strides=[2, 2],
                                      pads=[1, 0, 0, 1], output_padding=[1, 1]),
    "Conv (asymmetric pads)": lambda g: g.node("Conv", ["x", g.random(4, 2, 2, 2), g.random(4)], pads=[0, 1, 1, 0]),
    "Resize (nearest)": lambda g: g.node("Resize", ["x", "", g.const([1.0, 1.0, 2.0, 3.0])], mode="nearest"),
}


def _split_mul(g):
    first = f"s{g.count}a"
    second = f"s{g.count}b"
    g.nodes.append(onnx.helper.make_node("Split", ["x", g.const([3, 1], np.int64)], [first, second], axis=2,
                                         name="split"))
    return g.node("Mul", [first, second])


def _check(build, input_shape, rng, batch="N"):
    g = GraphMaker(rng)
    output = build(g)
    model = g.model([batch, *input_shape], output, output_rank=len(input_shape) + 1)
    network = load(model)
    x = rng.uniform(0.5, 2.0, size=(16, *network.input_shape))
    deviation = deviation_from_onnxruntime(network, model, x)
    assert deviation["relative"] <= TOLERANCE, deviation
    float32 = network.forward(x, "float32").numpy().reshape(len(x), -1)
    float64 = network.forward(x, "float64").numpy().reshape(len(x), -1)
    np.testing.assert_allclose(float32, float64, rtol=1e-4, atol=1e-4)
    return network


@pytest.mark.parametrize("name", sorted(CASES))
def test_operator_matches_onnxruntime(rng, name):
    _check(CASES[name], (3, 4), rng)


@pytest.mark.parametrize("name", sorted(IMAGE_CASES))
def test_image_operator_matches_onnxruntime(rng, name):
    _check(IMAGE_CASES[name], (2, 3, 3), rng)


def test_concat_with_a_constant_part_repeats_it_for_every_input(rng):
    """vit's class token: a (1, 1, 48) constant concatenated to a batch-of-one graph's tokens
    (onnxruntime runs such a graph one input at a time; assay repeats the constant per input)."""
    network = _check(lambda g: g.node("Concat", [g.random(1, 1, 4), "x"], axis=1), (3, 4), rng, batch=1)
    assert network.output_shape == (4, 4)


def test_relu_networks_keep_their_layers(rng):
    """A graph of ReLU-network operators is not folded and loads into Linear/ReLU layers as before."""
    g = GraphMaker(rng)
    h = g.node("Relu", [g.node("Gemm", ["x", g.random(4, 3), g.random(4)], transB=1)])
    network = load(g.model(["N", 3], g.node("Add", [g.node("MatMul", [h, g.random(4, 2)]), g.random(2)])))
    assert [type(layer).__name__ for layer in network.layers] == ["Linear", "ReLU", "Linear"]


@pytest.mark.parametrize("op, attrs", [("Transpose", {"perm": [1, 0, 2]}), ("Softmax", {"axis": 0})])
def test_an_operator_on_the_batch_axis_is_a_load_error_naming_the_node(rng, op, attrs):
    g = GraphMaker(rng)
    model = g.model(["N", 3, 4], g.node(op, ["x"], **attrs), output_rank=3)
    with pytest.raises(UnsupportedOperatorError, match=f"node '{op.lower()}_1'.*batch"):
        load(model)


def test_a_fixed_batch_of_one_that_the_graph_transposes_is_one_sample(rng):
    """ml4acopf's pattern: a (1, n) row transposed to a column and multiplied by a constant matrix."""
    g = GraphMaker(rng)
    column = g.node("Transpose", ["x"], perm=[1, 0])
    model = g.model([1, 3], g.node("Transpose", [g.node("MatMul", [g.random(5, 3), column])], perm=[1, 0]))
    network = load(model)
    assert network.input_shape == (1, 3) and network.output_shape == (1, 5)
    x = rng.uniform(-1, 1, size=(8, 1, 3))
    assert deviation_from_onnxruntime(network, model, x)["relative"] <= TOLERANCE


def test_an_operator_without_a_forward_rule_is_one_line_naming_node_and_operator(rng):
    g = GraphMaker(rng)
    model = g.model(["N", 3], g.node("Round", [g.node("Sigmoid", ["x"])]))
    with pytest.raises(UnsupportedOperatorError) as info:
        load(model)
    message = str(info.value)
    assert "\n" not in message and "'round_2'" in message and "'Round'" in message


# ---------------------------------------------------------------------- bound entry points
def sigmoid_network_file(rng, tmp_path) -> Path:
    g = GraphMaker(rng)
    h = g.node("Sigmoid", [g.node("Gemm", ["x", g.random(4, 3), g.random(4)], transB=1)])
    path = tmp_path / "sigmoid.onnx"
    onnx.save(g.model(["N", 3], g.node("Gemm", [h, g.random(2, 4), g.random(2)], transB=1)), str(path))
    return path


@pytest.mark.parametrize("method", ["ibp", "crown", "alpha", "beta"])
def test_bound_methods_refuse_an_operator_without_a_rule_in_one_line(rng, tmp_path, method, without_bound_rule):
    without_bound_rule(Sigmoid)
    network = load(sigmoid_network_file(rng, tmp_path))
    box = (torch.zeros(1, 3, dtype=torch.float64), torch.ones(1, 3, dtype=torch.float64))
    with pytest.raises(UnsupportedOperatorError) as info:
        compute_bounds(network, box, method=method)
    message = str(info.value)
    assert "\n" not in message and "'Sigmoid' (layer 1)" in message and "node 'sigmoid_2'" in message and "sigmoid.onnx" in message
    assert "Linear, Conv2d, ReLU" in message  # what is supported


@pytest.mark.parametrize("strategy", ["input", "relu"])
def test_verify_refuses_an_operator_without_a_bound_rule_before_searching(rng, tmp_path, strategy,
                                                                          without_bound_rule):
    """Even where an attack would find a counterexample at once (every output satisfies the spec's
    complement), verify ends in the engine's one-line error: its answers rest on the engine."""
    from assay.sets import Box, argmax_is
    from assay.verify import verify

    without_bound_rule(Sigmoid)
    network = load(sigmoid_network_file(rng, tmp_path))
    with pytest.raises(UnsupportedOperatorError, match=r"'Sigmoid' \(layer 1\)"):
        verify(network, Box(torch.zeros(3), torch.ones(3)), argmax_is(0, 2), strategy=strategy, timeout=10)


# ---------------------------------------------------------------------- vnncomp2024
# One or two networks per benchmark (~30 s in all); benchmarks/vnncomp2024_loading.py checks
# every network of every benchmark and writes the README's table.
NETWORKS_2024 = [
    "cgan_2023/onnx/cGAN_imgSz32_nCh_3_upsample.onnx.gz", "cgan_2023/onnx/cGAN_imgSz32_nCh_1_transposedConvPadding_1.onnx.gz",
    "linearizenn/onnx/AllInOne_10_10.onnx.gz", "lsnc/onnx/quadrotor2d_output.onnx.gz",
    "ml4acopf_2024/onnx/14_ieee_ml4acopf.onnx.gz", "ml4acopf_2024/onnx/14_ieee_ml4acopf-linear-nonresidual.onnx.gz",
    "ml4acopf_2024/onnx/14_ieee_ml4acopf-linear-residual.onnx.gz",  # Floor: the angle wrap of its sin/cos
    "cctsdb_yolo_2023/onnx/patch-1.onnx.gz",  # a patch placed by two inputs (IndexTable), ArgMax == label
    "nn4sys_2023/onnx/mscn_128d.onnx.gz", "nn4sys_2023/onnx/pensieve_small_parallel.onnx.gz",
    "safenlp/onnx/medical/perturbations_0.onnx.gz", "tllverifybench_2023/onnx/tllBench_n=2_N=M=8_m=1_instance_0_0.onnx.gz",
    "traffic_signs_recognition_2023/onnx/3_30_30_QConv_16_3_QConv_32_2_Dense_43_ep_30.onnx.gz",
    "vit_2023/onnx/pgd_2_3_16.onnx.gz",
]  # (yolo_2023's TinyYOLO uses ReLU-network operators only: 10 s more for nothing new)


def _first_property(folder: Path, network: str) -> Path:
    for line in (folder / "instances.csv").read_text().splitlines():
        fields = [f.strip().removeprefix("./") for f in line.split(",")]
        if fields[0] == network:
            return folder / fields[1]
    raise AssertionError(f"{network} has no instance in {folder / 'instances.csv'}")


@pytest.mark.data
@pytest.mark.parametrize("name", NETWORKS_2024, ids=lambda name: name.split("/")[-1].split(".")[0][:40])
def test_vnncomp2024_network_matches_onnxruntime(data_dir, name):
    folder, network_path = (data_dir / "vnncomp2024" / name.split("/")[0]), name.split("/", 1)[1]
    path = folder / network_path
    assert path.is_file(), f"{path} is missing from the shared data"
    network = load(path)
    box = read_vnnlib(_first_property(folder, network_path), num_inputs=network.input_size).queries[0].input_set
    rng = np.random.default_rng(0)
    x = rng.uniform(box.lower.numpy(), box.upper.numpy(), size=(100, network.input_size))
    model = onnx.load_model_from_string(gzip.decompress(path.read_bytes()))
    deviation = deviation_from_onnxruntime(network, model, x.reshape(100, *network.input_shape))
    assert deviation["relative"] <= TOLERANCE, deviation


def test_every_operator_is_documented_and_registered_by_its_onnx_name():
    import assay.nn.ops as ops
    from assay.nn._onnx_builders import BUILDERS

    for name in ops.__all__:
        cls = getattr(ops, name)
        assert inspect.getdoc(cls), name
        assert name == "Operator" or issubclass(cls, ops.Operator), name
    for op_type in ("Sigmoid", "Softmax", "Slice", "Split", "Gather", "Concat", "Transpose", "ReduceSum", "ReduceMean",
                    "Resize", "Upsample", "ConvTranspose", "Min", "Max", "Clip", "Pow", "LeakyRelu", "Sign", "Sin", "Floor",
                    "ArgMax", "Equal", "Cast"):
        assert op_type in BUILDERS, op_type


# ---------------------------------------------------------------------- decisions built into the graph
def _patch_and_decide(g) -> str:
    """cctsdb_yolo's shape in small: x (18,) holds a 4×4 image, a row index and a label; the row
    is zeroed (Cast → ScatterND), then Relu → padded MaxPool → ArgMax == label, as 0/1."""
    row = g.node("Reshape", [g.node("Cast", [g.node("Gather", ["x", g.const(16, np.int64)], axis=0)], to=7),
                             g.const([1, 1], np.int64)])
    mask = g.node("ScatterND", [g.const(np.ones((4, 4))), row, g.const(np.zeros((1, 4)))])
    image = g.node("Reshape", [g.node("Slice", ["x", g.const([0], np.int64), g.const([16], np.int64)]),
                               g.const([1, 1, 4, 4], np.int64)])
    h = g.node("Mul", [image, g.node("Reshape", [mask, g.const([1, 1, 4, 4], np.int64)])])
    h = g.node("MaxPool", [g.node("Relu", [h])], kernel_shape=[3, 3], strides=[3, 3], pads=[1, 1, 1, 1])
    index = g.node("Cast", [g.node("ArgMax", [g.node("Reshape", [h, g.const([1, 4], np.int64)])], axis=1, keepdims=0)],
                   to=1)
    same = g.node("Equal", [index, g.node("Gather", ["x", g.const(17, np.int64)], axis=0)])
    return g.node("Cast", [g.node("Cast", [same], to=7)], to=1)


def test_a_patch_placed_by_the_input_and_a_decision_match_onnxruntime_and_bound_soundly(rng):
    from tests.nn.test_onnx import GraphMaker

    g = GraphMaker(rng)
    model = g.model([18], _patch_and_decide(g), output_rank=1)
    network = load(model)
    assert {type(layer).__name__ for layer in network.layers} >= {"IndexTable", "ArgMax", "Equal", "Cast"}
    x = rng.uniform(-1.0, 1.0, size=(200, 18))
    x[:, 16] = rng.uniform(0.0, 3.999, size=200)
    x[:, 17] = rng.integers(0, 4, size=200)
    assert deviation_from_onnxruntime(network, model, x)["relative"] == 0.0
    # one image, every row and label: the bounds hold every output (and are exact at one point)
    lower, upper = torch.tensor(x[0]).clone(), torch.tensor(x[0]).clone()
    lower[16:], upper[16:] = torch.tensor([0.0, 0.0]), torch.tensor([3.999, 3.0])
    samples = lower + (upper - lower) * torch.rand(300, 18, dtype=torch.float64)
    samples[:, 17] = samples[:, 17].round()
    outputs = network.forward(samples)
    for method in ("ibp", "crown"):
        bounds = compute_bounds(network, (lower.unsqueeze(0), upper.unsqueeze(0)), method=method)
        assert (bounds.lower <= outputs).all() and (outputs <= bounds.upper).all(), method
    point = torch.tensor(x[:1])
    exact = compute_bounds(network, (point, point), method="ibp")
    y = network.forward(point)
    assert (exact.lower <= y).all() and (y <= exact.upper).all() and (exact.upper - exact.lower).max() < 1e-300
