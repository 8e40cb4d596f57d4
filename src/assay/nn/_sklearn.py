"""Convert a fitted scikit-learn ``MLPClassifier`` / ``MLPRegressor`` into a :class:`~assay.nn.Network`.

Contract:

* The estimator must be fitted (else :class:`ModelLoadError`) and use ``activation='relu'``
  (any other hidden activation raises :class:`UnsupportedOperatorError`).
* Layers: ``Linear(coefs_[k].T, intercepts_[k])`` with a ReLU after every hidden layer.
* The output is the **raw pre-activation of the output layer**: for ``MLPClassifier`` these are
  the logits *before* softmax (multiclass, one per class in ``classes_`` order) or before the
  logistic function (binary: one output, the logit of ``classes_[1]``; multilabel: one logit per
  label). ``predict`` picks the arg-max logit (multiclass) or ``logit > 0`` (binary). For
  ``MLPRegressor`` the output equals ``predict`` (shape ``(n_outputs,)`` per input).
* Input scaling done outside the estimator (e.g. a ``StandardScaler`` in a ``Pipeline``) is not
  included: pass the MLP step and scale the input set yourself.
* ``Network.source`` is ``"sklearn MLPClassifier"`` or ``"sklearn MLPRegressor"``.
"""

from __future__ import annotations

import numpy as np

from assay.errors import ModelLoadError, UnsupportedOperatorError
from assay.nn._build import LayerBuilder
from assay.nn.network import Network

__all__ = ["load_sklearn"]


def load_sklearn(estimator, input_shape=None) -> Network:
    """Convert a fitted MLP (see the module docstring)."""
    from sklearn.neural_network import MLPClassifier, MLPRegressor

    kind = type(estimator).__name__
    source = f"sklearn {kind}"
    if not isinstance(estimator, (MLPClassifier, MLPRegressor)):
        raise ModelLoadError(
            f"{source}: only fitted MLPClassifier and MLPRegressor estimators can be loaded "
            "(for a Pipeline, pass its MLP step and apply the preprocessing to the input set)"
        )
    if not hasattr(estimator, "coefs_"):
        raise ModelLoadError(f"{source} is not fitted; call fit() before loading it")
    if estimator.activation != "relu":
        raise UnsupportedOperatorError(
            f"{source}: activation={estimator.activation!r} cannot be represented by assay's Network, whose only "
            "non-linearity is ReLU; train the model with activation='relu'"
        )
    input_size = int(estimator.coefs_[0].shape[0])
    if input_shape is not None and tuple(int(d) for d in input_shape) != (input_size,):
        raise ModelLoadError(f"{source}: input_shape={tuple(input_shape)} but the model takes {input_size} features")
    builder = LayerBuilder((input_size,))
    last = len(estimator.coefs_) - 1
    for k, (coef, intercept) in enumerate(zip(estimator.coefs_, estimator.intercepts_)):
        where = f"{source}: layer {k}"
        builder.linear(np.asarray(coef, dtype=np.float64).T, np.asarray(intercept, dtype=np.float64), where)
        if k != last:
            builder.relu(where)
    return Network(tuple(builder.finish(source)), (input_size,), "X", "Y", source, sources=tuple(builder.sources))
