"""ONNX models built with onnx.helper: every supported operator against onnxruntime, and clear errors."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from assay.errors import ModelLoadError, UnsupportedOperatorError
from assay.nn import Add, AvgPool2d, Conv2d, Flatten, Linear, ReLU, load

from .ort_reference import assert_matches_ort

TOLERANCE = dict(rtol=1e-5, atol=1e-5)  # for the small, O(1) outputs compared directly here


class GraphMaker:
    """Builds a single-input chain graph; constants are float32 initializers."""

    def __init__(self, rng: np.random.Generator):
        self.rng, self.nodes, self.initializers, self.count = rng, [], [], 0

    def const(self, array, dtype=np.float32) -> str:
        name = f"c{len(self.initializers)}"
        self.initializers.append(numpy_helper.from_array(np.asarray(array, dtype=dtype), name))
        return name

    def random(self, *shape, scale=1.0) -> str:
        return self.const(self.rng.normal(size=shape) * scale)

    def node(self, op: str, inputs: list[str], **attrs) -> str:
        self.count += 1
        out = f"t{self.count}"
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"{op.lower()}_{self.count}", **attrs))
        return out

    def model(self, input_shape: list, output: str, output_rank: int = 2, opset: int = 13) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, "test", [helper.make_tensor_value_info("x", TensorProto.FLOAT, input_shape)],
            [helper.make_tensor_value_info(output, TensorProto.FLOAT, [None] * output_rank)], self.initializers,
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def check_against_ort(model: onnx.ModelProto, x: np.ndarray, tmp_path=None):
    """Load (from a file when tmp_path is given) and compare with onnxruntime."""
    if tmp_path is not None:
        path = tmp_path / "model.onnx"
        onnx.save(model, str(path))
        network = load(path)
        assert network.source == str(path)
    else:
        network = load(model)
    assert_matches_ort(network, model, x)
    return network


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_with_alpha_beta_and_trans_b(rng, trans_b, tmp_path):
    g = GraphMaker(rng)
    b = g.random(*((4, 3) if trans_b else (3, 4)))
    h = g.node("Gemm", ["x", b, g.random(4)], alpha=0.7, beta=1.3, transB=trans_b)
    h = g.node("Relu", [h])
    h = g.node("Gemm", [h, g.random(2, 4), g.random(1, 2)], transB=1)
    network = check_against_ort(g.model(["batch_size", 3], h), rng.normal(size=(16, 3)), tmp_path)
    assert network.input_name == "x" and network.output_name == h and network.input_shape == (3,)
    assert [type(layer) for layer in network.layers] == [Linear, ReLU, Linear]


@pytest.mark.parametrize("bias_first", [False, True])
def test_matmul_then_add_in_either_order(rng, bias_first):
    g = GraphMaker(rng)
    h = g.node("MatMul", ["x", g.random(5, 6)])
    bias = g.random(6)
    h = g.node("Add", [bias, h] if bias_first else [h, bias])
    h = g.node("Relu", [h])
    h = g.node("MatMul", [h, g.random(6, 3)])
    h = g.node("Add", [h, g.random(3)])
    network = check_against_ort(g.model([None, 5], h), rng.normal(size=(16, 5)))
    assert [type(layer) for layer in network.layers] == [Linear, ReLU, Linear]


def test_batchless_vector_with_the_matrix_on_the_left(rng):
    g = GraphMaker(rng)
    h = g.node("Add", [g.node("MatMul", [g.random(7, 4), "x"]), g.random(7)])
    h = g.node("Add", [g.node("MatMul", [g.random(2, 7), g.node("Relu", [h])]), g.random(2)])
    model = g.model([4], h, output_rank=1)
    network = load(model)
    assert network.input_shape == (4,)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = rng.normal(size=(8, 4)).astype(np.float32)
    expected = np.stack([session.run(None, {"x": row})[0] for row in x])
    np.testing.assert_allclose(network.forward(x).numpy(), expected, **TOLERANCE)


def test_normalised_conv_net_with_batchnorm_pooling_and_flatten(rng, tmp_path):
    g = GraphMaker(rng)
    h = g.node("Sub", ["x", g.const(rng.normal(size=(1, 4, 1, 1)))])
    h = g.node("Div", [h, g.const(rng.uniform(0.5, 2.0, size=(1, 4, 1, 1)))])
    h = g.node("Conv", [h, g.random(6, 2, 3, 3), g.random(6)], pads=[1, 1, 1, 1], strides=[2, 2], group=2)
    h = g.node("BatchNormalization", [h, g.const(rng.uniform(0.5, 2, 6)), g.random(6), g.random(6),
                                      g.const(rng.uniform(0.5, 2, 6))], epsilon=1e-3)
    h = g.node("Relu", [h])
    h = g.node("AveragePool", [h], kernel_shape=[2, 2], strides=[1, 1], pads=[1, 1, 1, 1], count_include_pad=1)
    h = g.node("Conv", [h, g.random(3, 6, 2, 2)], dilations=[2, 2], auto_pad="VALID")
    h = g.node("Flatten", [h], axis=1)
    h = g.node("Gemm", [h, g.random(5, 3 * 3 * 3), g.random(5)], transB=1)
    h = g.node("Dropout", [g.node("Identity", [h])])
    network = check_against_ort(g.model(["N", 4, 8, 8], h), rng.normal(size=(8, 4, 8, 8)), tmp_path)
    kinds = [type(layer) for layer in network.layers]
    # the normalisation has a shift and the first convolution pads: it stays a depthwise 1x1 convolution
    assert kinds == [Conv2d, Conv2d, ReLU, AvgPool2d, Conv2d, Flatten, Linear]
    assert network.layers[0].groups == 4


def test_per_channel_scale_folds_into_a_padded_convolution(rng):
    g = GraphMaker(rng)
    h = g.node("Mul", [g.const(rng.uniform(0.5, 2, size=(3, 1, 1))), "x"])
    h = g.node("Conv", [h, g.random(4, 3, 3, 3)], pads=[1, 1, 1, 1])
    h = g.node("Sub", [h, g.const(rng.normal(size=(4, 1, 1)))])  # folds back into the convolution
    h = g.node("Reshape", [g.node("Relu", [h]), g.const([0, -1], np.int64)])
    h = g.node("Gemm", [h, g.random(4 * 5 * 5, 2)])
    network = check_against_ort(g.model([1, 3, 5, 5], h), rng.normal(size=(1, 3, 5, 5)))
    assert [type(layer) for layer in network.layers] == [Conv2d, ReLU, Flatten, Linear]


def test_acasxu_style_per_element_normalisation_folds_through_flatten(rng):
    g = GraphMaker(rng)
    h = g.node("Sub", ["x", g.random(1, 1, 1, 5)])
    h = g.node("Div", [h, g.const(rng.uniform(0.5, 2, size=(5,)))])
    h = g.node("Flatten", [h])
    h = g.node("MatMul", [h, g.random(5, 8)])
    h = g.node("Add", [h, g.random(8)])
    h = g.node("Relu", [h])
    h = g.node("Mul", [h, g.const(rng.uniform(0.5, 2, size=(8,)))])  # after a ReLU: folds forward into the Gemm
    h = g.node("Gemm", [h, g.random(8, 3), g.random(3)])
    h = g.node("Relu", [h])
    h = g.node("Sub", [g.random(3), h])  # c - x at the very end: an explicit diagonal layer
    network = check_against_ort(g.model([1, 1, 1, 5], h), rng.normal(size=(1, 1, 1, 5)))
    assert network.input_shape == (1, 1, 5)
    assert [type(layer) for layer in network.layers] == [Flatten, Linear, ReLU, Linear, ReLU, Linear]


def test_batchnorm_after_gemm_folds_into_it(rng):
    g = GraphMaker(rng)
    h = g.node("Gemm", ["x", g.random(6, 3), g.random(6)], transB=1)
    h = g.node("BatchNormalization", [h, g.random(6), g.random(6), g.random(6), g.const(rng.uniform(0.5, 2, 6))])
    h = g.node("Relu", [h])
    network = check_against_ort(g.model(["batch", 3], h), rng.normal(size=(16, 3)))
    assert [type(layer) for layer in network.layers] == [Linear, ReLU]


def test_constant_nodes_and_symbolic_input_shape(rng):
    g = GraphMaker(rng)
    weight = helper.make_tensor("w", TensorProto.FLOAT, [3, 2], rng.normal(size=6).astype(np.float32).tolist())
    g.nodes.append(helper.make_node("Constant", [], ["w_out"], value=weight, name="const_w"))
    h = g.node("MatMul", ["x", "w_out"])
    model = g.model(["batch", "features"], h)
    with pytest.raises(ModelLoadError, match="input_shape"):
        load(model)
    network = load(model, input_shape=(3,))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = rng.normal(size=(4, 3)).astype(np.float32)
    np.testing.assert_allclose(network.forward(x).numpy(), session.run(None, {"x": x})[0], **TOLERANCE)
    with pytest.raises(ModelLoadError, match="does not match"):
        load(model, input_shape=(3, 1))


# ---------------------------------------------------------------------- errors
@pytest.mark.parametrize("op", ["Round", "Erf", "Elu"])  # (Sigmoid, Softmax, Tanh load since issue 32, Floor since ml4acopf)
def test_unsupported_operator_names_the_operator_node_and_file(rng, tmp_path, op):
    g = GraphMaker(rng)
    h = g.node("Gemm", ["x", g.random(4, 3), g.random(4)], transB=1)
    h = g.node(op, [h])
    path = tmp_path / "bad_op.onnx"
    onnx.save(g.model(["N", 3], h), str(path))
    with pytest.raises(UnsupportedOperatorError) as info:
        load(path)
    message = str(info.value)
    assert op in message and f"{op.lower()}_2" in message and "bad_op.onnx" in message
    assert "Gemm" in message and "Relu" in message  # lists the supported operators


def test_several_graph_inputs_are_rejected(rng):
    g = GraphMaker(rng)
    h = g.node("Add", ["x", "y"])
    graph = helper.make_graph(
        g.nodes, "two", [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 3]) for n in ("x", "y")],
        [helper.make_tensor_value_info(h, TensorProto.FLOAT, ["N", 3])],
    )
    with pytest.raises(ModelLoadError, match="2 inputs"):
        load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))


@pytest.mark.parametrize("skip", ["relu", "input"])
def test_residual_add_loads_as_a_graph(rng, skip):
    g = GraphMaker(rng)
    h = g.node("Gemm", ["x", g.random(3, 3), g.random(3)], transB=1)
    r = g.node("Relu", [h])
    h = g.node("Gemm", [r, g.random(3, 3), g.random(3)], transB=1)
    h = g.node("Mul", [h, g.random(3)])  # folded into the Gemm before it
    h = g.node("Add", [h, r if skip == "relu" else "x"])  # a skip connection
    h = g.node("Relu", [h])
    h = g.node("Gemm", [h, g.random(2, 3), g.random(2)], transB=1)
    network = check_against_ort(g.model(["N", 3], h), rng.normal(size=(32, 3)))
    assert not network.is_chain and sum(isinstance(layer, Add) for layer in network.layers) == 1


def test_a_tensor_read_twice_is_not_folded_into(rng):
    """A BatchNorm-like scale after a shared tensor must not be folded back into its producer."""
    g = GraphMaker(rng)
    h = g.node("Gemm", ["x", g.random(4, 3), g.random(4)], transB=1)
    a = g.node("Mul", [h, g.random(4)])  # reads h, which the Add reads too
    h = g.node("Add", [a, h])
    h = g.node("Relu", [h])
    check_against_ort(g.model(["N", 3], h), rng.normal(size=(16, 3)))


@pytest.mark.parametrize("kernel,stride", [(2, 2), (3, 2), (3, 1), (1, 2), (4, 4)])
def test_max_pool_is_lowered_exactly(rng, kernel, stride):
    g = GraphMaker(rng)
    h = g.node("Conv", ["x", g.random(3, 2, 2, 2), g.random(3)])
    h = g.node("MaxPool", [h], kernel_shape=[kernel, kernel], strides=[stride, stride])
    h = g.node("Flatten", [h], axis=1)
    side = (8 - 1 - kernel) // stride + 1
    h = g.node("Gemm", [h, g.random(2, 3 * side * side), g.random(2)], transB=1)
    network = check_against_ort(g.model([1, 2, 8, 8], h), rng.normal(size=(6, 2, 8, 8)))
    relus = sum(int(np.prod(network.shapes[i])) for i in network.relu_indices)
    assert relus == 3 * side * side * (kernel * kernel - 1)  # one ReLU per comparison
    assert all(layer.fixed for layer in network.layers[1:] if isinstance(layer, Conv2d))
    assert network.num_parameters == 3 * 2 * 2 * 2 + 3 + 2 * (3 * side * side + 1)


def test_zero_pad_then_average_pool(rng):
    g = GraphMaker(rng)
    h = g.node("Relu", ["x"])
    h = g.node("Pad", [h, g.const([0, 0, 1, 2, 0, 0, 1, 2], dtype=np.int64)], mode="constant")
    h = g.node("AveragePool", [h], kernel_shape=[2, 2], strides=[2, 2])
    h = g.node("Flatten", [h], axis=1)
    h = g.node("Gemm", [h, g.random(2, 2 * 4 * 5), g.random(2)], transB=1)
    check_against_ort(g.model([1, 2, 6, 6], h), rng.normal(size=(4, 2, 6, 6)))


def test_graph_operators_assay_cannot_represent_are_named(rng):
    g = GraphMaker(rng)
    h = g.node("MaxPool", ["x"], kernel_shape=[2, 2], pads=[1, 1, 1, 1])  # −inf padding of any values
    with pytest.raises(UnsupportedOperatorError, match="padding") as info:
        load(g.model([1, 1, 4, 4], h, output_rank=4))
    assert "node '" in str(info.value)


def test_padded_max_pooling_after_a_relu_pads_with_zeros(rng):
    """After a Relu every value is ≥ 0, so MaxPool's −inf padding is 0 padding (pads < kernel)."""
    g = GraphMaker(rng)
    h = g.node("MaxPool", [g.node("Relu", ["x"])], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    check_against_ort(g.model(["N", 2, 5, 5], h, output_rank=4), rng.normal(size=(6, 2, 5, 5)))


@pytest.mark.parametrize("case", ["asymmetric_pad", "sub"])
def test_asymmetric_pads_and_differences_of_tensors_load_as_general_operators(rng, case):
    """Refused before issue 32; now a Pad layer and a Binary (Sub) layer of assay.nn.ops."""
    g = GraphMaker(rng)
    h = g.node("Relu", ["x"])
    if case == "asymmetric_pad":
        h = g.node("Pad", [h, g.const([0, 0, 0, 1, 0, 0, 1, 0], dtype=np.int64)], mode="constant")
    else:
        h = g.node("Sub", [h, "x"])
    network = check_against_ort(g.model([1, 1, 4, 4], h, output_rank=4), rng.normal(size=(4, 1, 4, 4)))
    assert type(network.layers[-1]).__name__ == ("Pad" if case == "asymmetric_pad" else "Binary")


def test_average_pool_excluding_padding_is_unsupported(rng):
    g = GraphMaker(rng)
    h = g.node("AveragePool", ["x"], kernel_shape=[2, 2], pads=[1, 1, 1, 1])
    with pytest.raises(UnsupportedOperatorError, match="count_include_pad"):
        load(g.model(["N", 1, 4, 4], h))


def test_asymmetric_conv_pads_and_general_reshapes_load(rng):
    """Refused before issue 32; now a general Conv layer and a Reshape to (2, 3) per input."""
    g = GraphMaker(rng)
    h = g.node("Conv", ["x", g.random(2, 1, 3, 3)], pads=[0, 0, 1, 1])
    network = check_against_ort(g.model(["N", 1, 5, 5], h, output_rank=4), rng.normal(size=(4, 1, 5, 5)))
    assert type(network.layers[0]).__name__ == "Conv" and network.output_shape == (2, 4, 4)
    g = GraphMaker(rng)
    h = g.node("Reshape", ["x", g.const([-1, 2, 3], np.int64)])
    network = check_against_ort(g.model(["N", 6], h, output_rank=3), rng.normal(size=(4, 6)))
    assert network.output_shape == (2, 3)


def test_inconsistent_shapes_are_a_model_load_error(rng):
    g = GraphMaker(rng)
    h = g.node("MatMul", ["x", g.random(4, 2)])
    with pytest.raises(ModelLoadError, match="4 inputs"):
        load(g.model(["N", 3], h))
