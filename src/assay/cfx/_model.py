"""What the counterfactual modules share: the target class as output rows, and a small MILP builder.

**Validity.** A network with one output is a binary classifier whose output is the logit of class 1
(scikit-learn's ``MLPClassifier``): class 1 iff the logit > 0. A network with k ≥ 2 outputs predicts
the arg-max. "x is classified as ``target``" is written as rows ``C y ≥ 0`` that must all be
*strictly* positive: ``[+1]`` (target 1) or ``[−1]`` (target 0) for one output, ``e_t − e_j`` for
every j ≠ t otherwise. A tie (a row exactly 0) counts as invalid, so validity is never claimed on a
boundary.

**MILP.** :class:`MilpBuilder` collects variables (bounds, integrality) and sparse rows and solves
with HiGHS through :func:`scipy.optimize.milp`; :class:`MilpSolution` carries the primal point, the
objective, the solver's proven bound and the status. scipy is imported on the first solve.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from assay.errors import DataError, OptionError
from assay.nn import Linear, Network, ReLU


def check_mlp(network: Network, where: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """The (W, b) of each Linear layer of a Linear/ReLU chain (ReLU between each pair), or an error."""
    layers = network.layers
    if len(network.input_shape) != 1:
        raise DataError(f"{where} needs a network over flat feature vectors; {network.source} takes {network.input_shape}")
    affine = []
    expect_linear = True
    for index, layer in enumerate(layers):
        if expect_linear and isinstance(layer, Linear):
            affine.append((layer.weight.numpy(), layer.bias.numpy()))
            expect_linear = False
        elif not expect_linear and isinstance(layer, ReLU) and index != len(layers) - 1:
            expect_linear = True
        else:
            raise DataError(f"{where} handles multilayer perceptrons (Linear, ReLU, Linear, …, Linear); layer {index} "
                            f"of {network.source} is a {type(layer).__name__} there")
    if expect_linear:
        raise DataError(f"{where}: {network.source} must end with a Linear layer")
    return affine


def target_rows(network: Network, target: int) -> np.ndarray:
    """Rows ``C`` (S, n_out) such that "classified as ``target``" ⇔ ``C f(x) > 0`` row by row."""
    outputs = network.output_size
    classes = 2 if outputs == 1 else outputs
    try:
        target = int(target)
    except (TypeError, ValueError):
        raise OptionError(f"the target class must be an int in 0..{classes - 1}; got {target!r}") from None
    if not 0 <= target < classes:
        raise OptionError(f"the target class must be in 0..{classes - 1} for {network.source}; got {target}")
    if outputs == 1:
        return np.array([[1.0 if target == 1 else -1.0]])
    rows = [np.eye(outputs)[target] - np.eye(outputs)[j] for j in range(outputs) if j != target]
    return np.array(rows)


def predicted_class(network: Network, x) -> np.ndarray:
    """The class of each row of ``x`` (binary: logit > 0 → 1)."""
    y = network.forward(torch.as_tensor(np.atleast_2d(x)), dtype="float64").numpy()
    if y.shape[1] == 1:
        return (y[:, 0] > 0).astype(int)
    return y.argmax(1)


def row_margins(network: Network, x, C: np.ndarray) -> np.ndarray:
    """``min_s (C f(x))_s`` for each row of ``x`` (> 0: classified as the target)."""
    y = network.forward(torch.as_tensor(np.atleast_2d(x)), dtype="float64").numpy()
    return (y @ C.T).min(1)


@dataclass(frozen=True)
class MilpSolution:
    """A solve's outcome: ``status`` is "optimal", "feasible" (time limit with a point), "infeasible",
    "timeout" (no point) or "error"; ``bound`` is the solver's proven bound on the optimum (minimisation)."""

    status: str
    x: np.ndarray | None
    objective: float
    bound: float
    message: str


@contextmanager
def _solver_output_muted():
    """Send file descriptor 1 to /dev/null while HiGHS runs: it prints some internal notices
    (e.g. ``HighsMipSolverData::transformNewIntegerFeasibleSolution``) straight to the C-level
    stdout even with ``disp=False``, which would corrupt ``assay cfx --json``."""
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError, AttributeError):
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


class MilpBuilder:
    """Variables and sparse linear rows of a minimisation MILP, solved by HiGHS."""

    def __init__(self):
        self.lower: list[float] = []
        self.upper: list[float] = []
        self.integer: list[int] = []
        self.cost: list[float] = []
        self.rows: list[tuple[dict[int, float], float, float]] = []

    def add(self, count: int, lower, upper, integer: bool = False, cost=0.0) -> np.ndarray:
        """Add ``count`` variables; returns their indices."""
        start = len(self.lower)
        self.lower.extend(np.broadcast_to(np.asarray(lower, float), (count,)).tolist())
        self.upper.extend(np.broadcast_to(np.asarray(upper, float), (count,)).tolist())
        self.integer.extend([1 if integer else 0] * count)
        self.cost.extend(np.broadcast_to(np.asarray(cost, float), (count,)).tolist())
        return np.arange(start, start + count)

    def row(self, terms: dict[int, float], lower: float = -np.inf, upper: float = np.inf) -> None:
        """Add ``lower ≤ Σ coef · var ≤ upper``."""
        self.rows.append((terms, float(lower), float(upper)))

    def linear_rows(self, matrix: np.ndarray, columns: np.ndarray, extra: dict[int, np.ndarray] | None,
                    lower: np.ndarray, upper: np.ndarray) -> None:
        """Add one row per row of ``matrix`` over ``columns`` (plus ``extra[var]`` coefficients per row)."""
        for r in range(matrix.shape[0]):
            terms = {int(c): float(v) for c, v in zip(columns, matrix[r]) if v != 0.0}
            for var, coefs in (extra or {}).items():
                if coefs[r] != 0.0:
                    terms[int(var)] = terms.get(int(var), 0.0) + float(coefs[r])
            self.row(terms, lower[r], upper[r])

    def solve(self, cost=None, time_limit: float | None = None, gap: float = 1e-6) -> MilpSolution:
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import csr_array

        n = len(self.lower)
        c = np.asarray(self.cost if cost is None else cost, dtype=float)
        data, indices, indptr, lo, hi = [], [], [0], [], []
        for terms, l, u in self.rows:
            indices.extend(terms.keys())
            data.extend(terms.values())
            indptr.append(len(indices))
            lo.append(l)
            hi.append(u)
        constraints = []
        if self.rows:
            matrix = csr_array((np.array(data, float), np.array(indices, int), np.array(indptr, int)), shape=(len(self.rows), n))
            constraints = [LinearConstraint(matrix, np.array(lo), np.array(hi))]
        options = {"mip_rel_gap": gap, "disp": False}
        if time_limit is not None:
            options["time_limit"] = max(float(time_limit), 1e-3)
        with _solver_output_muted():
            result = milp(c, integrality=np.array(self.integer), bounds=Bounds(np.array(self.lower), np.array(self.upper)),
                          constraints=constraints, options=options)
            if result.status not in (0, 1, 2):  # a HiGHS "solve error" (seen after its presolve): once more without it
                result = milp(c, integrality=np.array(self.integer),
                              bounds=Bounds(np.array(self.lower), np.array(self.upper)), constraints=constraints,
                              options={**options, "presolve": False})
        bound = getattr(result, "mip_dual_bound", None)
        if result.status == 0:
            status = "optimal"
        elif result.status == 1:
            status = "feasible" if result.x is not None else "timeout"
        elif result.status == 2:
            status = "infeasible"
        else:
            status = "error"
        objective = float(result.fun) if result.x is not None else np.inf
        if bound is None or not np.isfinite(bound):
            bound = objective if status == "optimal" else -np.inf
        return MilpSolution(status, None if result.x is None else np.asarray(result.x), objective, float(bound),
                            str(result.message))


def relu_rows(builder: MilpBuilder, pre_terms, pre_const: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """Post-activation variables ``h = relu(z)`` for ``z = pre_terms[i] + pre_const[i]`` with sound bounds [lower, upper].

    ``pre_terms[i]`` is a dict {variable: coefficient}. Stable neurons are linear (h = 0 or h = z);
    an unstable one gets a binary a with the exact big-M encoding
    ``h ≥ z, h ≤ z − lower·(1 − a), h ≤ upper·a`` (valid because lower ≤ z ≤ upper holds).
    """
    count = len(pre_const)
    h = builder.add(count, 0.0, np.maximum(upper, 0.0))
    for i in range(count):
        terms = dict(pre_terms[i])
        if upper[i] <= 0:
            builder.row({int(h[i]): 1.0}, 0.0, 0.0)
            continue
        minus = {k: -v for k, v in terms.items()}
        if lower[i] >= 0:
            builder.row({**minus, int(h[i]): 1.0}, pre_const[i], pre_const[i])  # h − z = 0
            continue
        a = int(builder.add(1, 0.0, 1.0, integer=True)[0])
        builder.row({**minus, int(h[i]): 1.0}, pre_const[i], np.inf)  # h ≥ z
        builder.row({**minus, int(h[i]): 1.0, a: -lower[i]}, -np.inf, pre_const[i] - lower[i])  # h ≤ z − l(1 − a)
        builder.row({int(h[i]): 1.0, a: -upper[i]}, -np.inf, 0.0)  # h ≤ u a
    return h
