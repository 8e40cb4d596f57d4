"""Every network of the VNN-COMP benchmarks in ../shared/data/vnncomp loads, matches onnxruntime,
and gets sound bounds where it has residual connections or pooling."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from assay.bounds import compute_bounds
from assay.nn import Add, load

from .ort_reference import assert_matches_ort

NETWORKS = [
    "cifar10_resnet/onnx/resnet_2b.onnx", "cifar10_resnet/onnx/resnet_4b.onnx",
    "collins_rul_cnn/onnx/NN_rul_full_window_20.onnx", "collins_rul_cnn/onnx/NN_rul_full_window_40.onnx",
    "collins_rul_cnn/onnx/NN_rul_small_window_20.onnx",
    "mnist_fc/onnx/mnist-net_256x2.onnx", "mnist_fc/onnx/mnist-net_256x4.onnx", "mnist_fc/onnx/mnist-net_256x6.onnx",
    "oval21/onnx/cifar_base_kw.onnx", "oval21/onnx/cifar_deep_kw.onnx", "oval21/onnx/cifar_wide_kw.onnx",
    "reach_prob_density/onnx/gcas.onnx", "reach_prob_density/onnx/robot.onnx", "reach_prob_density/onnx/vdp.onnx",
    "rl_benchmarks/onnx/cartpole.onnx", "rl_benchmarks/onnx/dubinsrejoin.onnx", "rl_benchmarks/onnx/lunarlander.onnx",
    "verivital/Convnet_avgpool.onnx", "verivital/Convnet_maxpool.onnx",
]
GRAPHS = ["cifar10_resnet/onnx/resnet_2b.onnx", "verivital/Convnet_avgpool.onnx", "verivital/Convnet_maxpool.onnx"]


def _path(data_dir: Path, name: str) -> Path:
    path = data_dir / "vnncomp" / name
    assert path.is_file(), f"{path} is missing from the shared data"
    return path


@pytest.mark.data
@pytest.mark.parametrize("name", NETWORKS)
def test_loads_and_matches_onnxruntime(data_dir, name):
    path = _path(data_dir, name)
    network = load(path)
    rng = np.random.default_rng(0)
    x = rng.uniform(0.0, 1.0, size=(3, *network.input_shape)).astype(np.float32)
    # float32 and float64 against onnxruntime in float32; float64 against onnxruntime in float64 where
    # onnxruntime has double kernels (not for Conv on CPU)
    assert_matches_ort(network, onnx.load(str(path)), x, label=name)
    if "resnet" in name:
        assert sum(isinstance(layer, Add) for layer in network.layers) >= 2 and not network.is_chain


def refine_here(name: str) -> bool:
    return "resnet_2b" in name


@pytest.mark.data
@pytest.mark.parametrize("name", GRAPHS)
def test_graph_network_bounds_contain_sampled_outputs(data_dir, name):
    """IBP, and CROWN's backward pass through the graph, never exclude a sampled output.

    Intermediate CROWN on the 40,000 ReLUs of the lowered MaxPool costs minutes, so CROWN here
    reuses IBP's intermediate bounds (``refine_intermediate=False``) except on resnet_2b.
    """
    torch.manual_seed(0)
    network = load(_path(data_dir, name))
    center = torch.rand(1, *network.input_shape, dtype=torch.float64)
    eps = 0.002 if refine_here(name) else 0.01
    box = (center - eps, center + eps)
    ibp = compute_bounds(network, box, method="ibp")
    refine = refine_here(name)
    crown = compute_bounds(network, box, method="crown", intermediate=None if refine else ibp.intermediate,
                           refine_intermediate=refine)
    samples = center + eps * (2 * torch.rand(2000, *network.input_shape, dtype=torch.float64) - 1)
    samples[:500] = center + eps * torch.sign(samples[:500] - center)  # box vertices
    outputs = network.forward(samples).reshape(len(samples), -1)
    for result in (ibp, crown):
        assert (outputs >= result.lower).all() and (outputs <= result.upper).all(), result.method
    assert (crown.upper - crown.lower).mean() <= (ibp.upper - ibp.lower).mean()


@pytest.mark.data
def test_the_pooled_twin_matches_onnxruntime_and_its_bounds_hold(data_dir):
    """The MaxPool network's twin (MaxPool2d layers) computes what onnxruntime computes, and its
    CROWN bounds (intermediate bounds refined: cheap without the lowered pooling ReLUs) contain
    sampled outputs and are tighter than the lowered network's."""
    path = _path(data_dir, "verivital/Convnet_maxpool.onnx")
    network = load(path)
    assert network.pooled is not None and len(network.pooled.layers) < len(network.layers)
    x = np.random.default_rng(1).uniform(0.0, 1.0, size=(3, *network.input_shape)).astype(np.float32)
    assert_matches_ort(network.pooled, onnx.load(str(path)), x, label="pooled twin")
    torch.manual_seed(1)
    center = torch.rand(1, *network.input_shape, dtype=torch.float64)
    box = (center - 0.01, center + 0.01)
    pooled = compute_bounds(network.pooled, box, method="crown")
    lowered = compute_bounds(network, box, method="crown", intermediate=compute_bounds(network, box, method="ibp").intermediate,
                             refine_intermediate=False)
    samples = center + 0.01 * (2 * torch.rand(2000, *network.input_shape, dtype=torch.float64) - 1)
    samples[:500] = center + 0.01 * torch.sign(samples[:500] - center)
    outputs = network.pooled.forward(samples).reshape(len(samples), -1)
    assert (outputs >= pooled.lower).all() and (outputs <= pooled.upper).all()
    assert (pooled.upper - pooled.lower).mean() < (lowered.upper - lowered.lower).mean()
