"""Networks: the `Network` representation and loaders for ONNX, .nnet, torch and scikit-learn."""

from assay.nn.layers import Add, AvgPool2d, Conv2d, Flatten, Linear, ReLU, Reshape
from assay.nn.load import load
from assay.nn.network import Network

__all__ = ["Network", "Linear", "Conv2d", "ReLU", "AvgPool2d", "Flatten", "Reshape", "Add", "load"]
