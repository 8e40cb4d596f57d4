"""The torch model that PGD differentiates: the network's exact forward pass, with gradients
that step functions do not have.

Binarised networks (larq-style quantised layers, exported to ONNX as ``Sign`` operators) are
piecewise constant in their input: the gradient of every ``Sign`` is zero almost everywhere,
so plain PGD never moves. :func:`attack_model` keeps every forward value exact — ``Sign``
stays ``torch.sign``, so the margin PGD reads is the true margin of the network (in the
model's dtype) — and changes only what flows backward:

* a ``Sign`` passes back the gradient of the surrogate ``tanh(x / τ)``, with τ =
  :data:`SURROGATE_SCALE` × the mean ``|x|`` of that ``Sign``'s input, per sample and per call
  (a surrogate on the scale of the values it sees: a fixed τ is flat on a convolution's
  large pre-activations and a spike on a dense layer's small ones);
* the larq pattern ``sign(a · sign(x) + b)`` (an ``Affine`` between two ``Sign`` layers,
  ``sign(sign(x) + 0.1)`` maps sign(0) = 0 to 1) passes the gradient of its outer ``Sign``
  straight through (identity): its input is ``±a + b``, where a tanh surrogate is flat; the
  inner ``Sign`` carries the surrogate.

A final ``Softmax`` over the whole output is dropped when every row of the query compares two
outputs (``y_i − y_j``, d = 0): softmax is strictly increasing in each logit against the others,
so those comparisons are the same on the logits, whose gradient does not vanish where softmax
saturates. For any other row (a threshold on a probability, a weighted sum) it is kept.

Nothing here decides a verdict: every point PGD returns is re-checked by the plain float64
forward pass (:func:`assay.verify.attack.confirm`) and by onnxruntime where the network came
from an ONNX file (:mod:`assay.verify.onnx_recheck`).
"""

from __future__ import annotations

import torch

from assay.bounds.rules import rule_for
from assay.nn.network import Network
from assay.nn.ops.arith import Affine
from assay.verify.problem import UnsafeQuery

__all__ = ["attack_model", "has_sign", "drops_softmax", "sign_roles", "SURROGATE_SCALE"]

# τ of a Sign's tanh surrogate, relative to the mean |input| of that Sign (per sample).
SURROGATE_SCALE = 0.25


def _needs_surrogate(layer) -> bool:
    """Whether the registry's rule of ``layer`` asks the attack for a surrogate gradient (``Sign``)."""
    rule = rule_for(layer)
    return rule is not None and rule.attack_gradient == "surrogate"


def has_sign(network: Network) -> bool:
    """True when some layer of ``network`` is a ``Sign`` (a binarised network)."""
    return any(_needs_surrogate(layer) for layer in network.layers)


def sign_roles(network: Network) -> dict[int, str]:
    """Per ``Sign`` layer index, how the attack model differentiates it: ``"straight"`` for the
    outer ``Sign`` of ``Sign → Affine → Sign`` (each reading the one before), else ``"surrogate"``."""
    roles = {}
    for index, layer in enumerate(network.layers):
        if not _needs_surrogate(layer):
            continue
        roles[index] = "surrogate"
        (read,) = network.sources[index]
        if read >= 1 and isinstance(network.layers[read - 1], Affine):
            (inner,) = network.sources[read - 1]
            if inner >= 1 and _needs_surrogate(network.layers[inner - 1]):
                roles[index] = "straight"
    return roles


def drops_softmax(network: Network, query: UnsafeQuery) -> bool:
    """True when the attack may drop the network's final ``Softmax``: it is the last layer, it
    normalises the whole output (one group of every output), and every row of the query is a
    pure difference of two outputs (one +1, one −1, zeros elsewhere) with offset 0."""
    if not network.layers:
        return False
    rule = rule_for(network.layers[-1])
    if rule is None or not rule.keeps_order:
        return False
    shape = network.output_shape
    if shape[network.layers[-1].axis] != network.output_size:
        return False
    C, d = query.C, query.d
    if bool((d != 0).any()):
        return False
    plus, minus = (C == 1).sum(1), (C == -1).sum(1)
    zero = (C == 0).sum(1)
    return bool(((plus == 1) & (minus == 1) & (zero == C.shape[1] - 2)).all())


def attack_model(network: Network, query: UnsafeQuery, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The module PGD differentiates for ``query`` on ``network``, in ``dtype``, parameters frozen.

    Its forward pass equals ``network.forward`` in that dtype, except that a dropped final
    Softmax (:func:`drops_softmax`) leaves the logits, which order the query's rows the same way.
    Its backward pass differs only through ``Sign`` layers (module docstring).
    """
    replace: dict[int, torch.nn.Module] = {}
    for index, role in sign_roles(network).items():
        replace[index] = _StraightSign() if role == "straight" else _SurrogateSign()
    if drops_softmax(network, query):
        replace[len(network.layers) - 1] = torch.nn.Identity()
    model = network.to_torch(replace=replace).to(dtype)
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model


class _SurrogateSignFunction(torch.autograd.Function):
    @staticmethod
    def forward(x):
        return torch.sign(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        (x,) = inputs
        ctx.save_for_backward(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        dims = tuple(range(1, x.ndim))
        tau = SURROGATE_SCALE * x.abs().mean(dim=dims, keepdim=True) if dims else SURROGATE_SCALE * x.abs()
        tau = tau.clamp(min=torch.finfo(x.dtype).tiny)
        return grad * (1 - torch.tanh(x / tau) ** 2) / tau


class _StraightSignFunction(_SurrogateSignFunction):
    """The same exact forward pass; the gradient passes through unchanged."""

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, grad):
        return grad


class _SurrogateSign(torch.nn.Module):
    """``torch.sign`` forward; backward the gradient of ``tanh(x / τ)`` (τ per sample)."""

    def forward(self, x):
        return _SurrogateSignFunction.apply(x)


class _StraightSign(torch.nn.Module):
    """``torch.sign`` forward; backward the identity (straight-through)."""

    def forward(self, x):
        return _StraightSignFunction.apply(x)
