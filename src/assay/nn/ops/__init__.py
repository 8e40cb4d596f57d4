"""The general operators of a :class:`~assay.nn.Network`, one module per family.

==================  ====================================================================
module              operators
==================  ====================================================================
``activation``      Sigmoid, Tanh, Exp, Log, Reciprocal, Sqrt, Sin, Cos, Abs, Sign, Floor,
                    Neg, Pow (constant exponent), LeakyRelu, Clip
``arith``           Binary (Add/Sub/Mul/Div of two tensors), MinMax, MatMul (two tensors),
                    ConstMatMul, Affine (element-wise constants)
``shape``           Slice, Gather, Concat, Transpose, Pad, Resize (nearest)
``reduce``          Reduce (sum, mean)
``softmax``         Softmax
``conv``            Conv (N-d, asymmetric pads, transposed)
``decision``        ArgMax, Equal, Cast, IndexTable (a sub-graph indexed by integer casts)
==================  ====================================================================

Every operator subclasses :class:`~assay.nn.ops.base.Operator` (its conventions are there). The
ReLU-network layers (Linear, Conv2d, ReLU, pooling, Flatten, Reshape, Add) stay in
:mod:`assay.nn.layers`: the bound engine has rules for those.
"""

from assay.nn.ops.activation import (
    Abs,
    Clip,
    Cos,
    Exp,
    Floor,
    LeakyRelu,
    Log,
    Neg,
    Pow,
    Reciprocal,
    Sigmoid,
    Sign,
    Sin,
    Sqrt,
    Tanh,
)
from assay.nn.ops.arith import Affine, Binary, ConstMatMul, MatMul, MinMax
from assay.nn.ops.base import Operator
from assay.nn.ops.conv import Conv
from assay.nn.ops.decision import ArgMax, Cast, Equal, IndexTable
from assay.nn.ops.reduce import Reduce
from assay.nn.ops.shape import Concat, Gather, Pad, Resize, Slice, Transpose
from assay.nn.ops.softmax import Softmax

__all__ = [
    "Operator", "Sigmoid", "Tanh", "Exp", "Log", "Reciprocal", "Sqrt", "Sin", "Cos", "Abs", "Sign", "Floor", "Neg",
    "Pow", "LeakyRelu", "Clip", "Binary", "MinMax", "MatMul", "ConstMatMul", "Affine", "Slice", "Gather", "Concat",
    "Transpose", "Pad", "Resize", "Reduce", "Softmax", "Conv",
    "ArgMax", "Equal", "Cast", "IndexTable",
]
