"""What the counterfactual modules share: the target class as output rows, and a small MILP builder.

**Validity.** A network with one output is a binary classifier whose output is the logit of class 1
(scikit-learn's ``MLPClassifier``): class 1 iff the logit > 0. A network with k ≥ 2 outputs predicts
the arg-max. "x is classified as ``target``" is written as rows ``C y ≥ 0`` that must all be
*strictly* positive: ``[+1]`` (target 1) or ``[−1]`` (target 0) for one output, ``e_t − e_j`` for
every j ≠ t otherwise. A tie (a row exactly 0) counts as invalid, so validity is never claimed on a
boundary.

**MILP.** :class:`MilpBuilder` collects variables (bounds, integrality) and sparse rows and solves
with HiGHS through highspy (:func:`run_highs`, settings :data:`HIGHS_OPTIONS`); :class:`MilpSolution`
carries the primal point, the objective, the solver's proven bound and the status. highspy is
imported on the first solve.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from assay._lp import SOLVER_THREADS, silent_highs, stdout_muted
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


# Relative optimality gap of every MILP: 0 asks HiGHS for the optimum itself (its absolute gap, 1e-6,
# remains), which "the nearest counterfactual" needs.
MIP_REL_GAP = 0.0

# HiGHS settings for the small MILPs of this package (tens of variables, ≤ ~100 binaries). Measured
# on the Table 1 models (benchmarks/cfx.py): HiGHS's primal heuristics (RINS, RENS, feasibility jump,
# root reduced-cost fixing, each a sub-MIP) took most of every solve's time while branch and bound
# alone closes these problems in a few dozen nodes; one thread, since callers batch over inputs.
# None of these settings changes what is proven: optimality and infeasibility are the solver's.
HIGHS_OPTIONS = {
    "threads": SOLVER_THREADS,
    "mip_heuristic_effort": 0.0,
    "mip_heuristic_run_rins": False,
    "mip_heuristic_run_rens": False,
    "mip_heuristic_run_root_reduced_cost": False,
    "mip_heuristic_run_feasibility_jump": False,
}


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
        for column, value in ((self.lower, lower), (self.upper, upper), (self.cost, cost)):
            if np.ndim(value) == 0:
                column.extend([float(value)] * count)
            else:
                column.extend(np.broadcast_to(np.asarray(value, float), (count,)).tolist())
        self.integer.extend([1 if integer else 0] * count)
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

    def solve(self, cost=None, time_limit: float | None = None, gap: float = MIP_REL_GAP) -> MilpSolution:
        """Solve with HiGHS (:data:`HIGHS_OPTIONS`); ``gap`` is the relative optimality gap (0: exact optimum,
        up to HiGHS's absolute gap of 1e-6)."""
        c = np.asarray(self.cost if cost is None else cost, dtype=float)
        starts = np.zeros(len(self.rows) + 1, dtype=np.int32)
        starts[1:] = np.cumsum([len(terms) for terms, _, _ in self.rows])
        index = np.fromiter((k for terms, _, _ in self.rows for k in terms), dtype=np.int32, count=int(starts[-1]))
        value = np.fromiter((v for terms, _, _ in self.rows for v in terms.values()), dtype=float, count=int(starts[-1]))
        problem = _Problem(c, np.array(self.lower, float), np.array(self.upper, float), np.array(self.integer, bool),
                           starts, index, value, np.array([r[1] for r in self.rows], float),
                           np.array([r[2] for r in self.rows], float))
        options = {**HIGHS_OPTIONS, "mip_rel_gap": float(gap)}
        if time_limit is not None:
            options["time_limit"] = max(float(time_limit), 1e-3)
        with stdout_muted():
            outcome = run_highs(problem, options)
            if outcome.status in ("error", "unbounded_or_infeasible"):
                # A HiGHS "solve error" after its presolve (seen on sba), or presolve's "infeasible or
                # unbounded" (our problems are bounded): once more without presolve.
                outcome = run_highs(problem, {**options, "presolve": "off"})
        status = outcome.status
        if status == "time_limit":
            status = "feasible" if outcome.x is not None else "timeout"
        elif status not in ("optimal", "infeasible"):
            status = "error"
        x = outcome.x if status in ("optimal", "feasible") else None
        objective = float(c @ x) if x is not None else np.inf
        bound = outcome.bound
        if bound is None or not np.isfinite(bound):
            bound = objective if status == "optimal" else -np.inf
        return MilpSolution(status, x, objective, float(bound), outcome.message)


@dataclass(frozen=True)
class _Problem:
    """A MILP in the arrays HiGHS reads: minimise cost·x, lower ≤ x ≤ upper, row_lower ≤ A x ≤ row_upper
    (A row-wise: starts, index, value), integer where ``integer``."""

    cost: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    integer: np.ndarray
    starts: np.ndarray
    index: np.ndarray
    value: np.ndarray
    row_lower: np.ndarray
    row_upper: np.ndarray


@dataclass(frozen=True)
class _Outcome:
    """HiGHS's answer: status "optimal", "infeasible", "time_limit", "unbounded_or_infeasible" or "error"."""

    status: str
    x: np.ndarray | None
    bound: float | None
    message: str


def run_highs(problem: _Problem, options: dict) -> _Outcome:
    """One HiGHS run through highspy (the one place the solver is called: tests replace it)."""
    import highspy

    highs = silent_highs()
    for name, value in options.items():
        highs.setOptionValue(name, value)
    inf = highspy.kHighsInf
    lp = highspy.HighsLp()
    lp.num_col_ = len(problem.cost)
    lp.num_row_ = len(problem.row_lower)
    lp.col_cost_ = problem.cost
    lp.col_lower_ = np.where(np.isneginf(problem.lower), -inf, problem.lower)
    lp.col_upper_ = np.where(np.isposinf(problem.upper), inf, problem.upper)
    lp.row_lower_ = np.where(np.isneginf(problem.row_lower), -inf, problem.row_lower)
    lp.row_upper_ = np.where(np.isposinf(problem.row_upper), inf, problem.row_upper)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_ = problem.starts
    lp.a_matrix_.index_ = problem.index
    lp.a_matrix_.value_ = problem.value
    if problem.integer.any():
        kinds = highspy.HighsVarType
        lp.integrality_ = [kinds.kInteger if flag else kinds.kContinuous for flag in problem.integer]
    highs.passModel(lp)
    highs.run()
    model_status = highs.getModelStatus()
    kinds = highspy.HighsModelStatus
    status = {kinds.kOptimal: "optimal", kinds.kInfeasible: "infeasible", kinds.kTimeLimit: "time_limit",
              kinds.kUnboundedOrInfeasible: "unbounded_or_infeasible"}.get(model_status, "error")
    info = highs.getInfo()
    x = None
    if status in ("optimal", "time_limit") and info.primal_solution_status == 2:  # 2: a feasible point
        x = np.array(highs.getSolution().col_value, dtype=float)
    bound = float(info.mip_dual_bound) if problem.integer.any() else (
        float(info.objective_function_value) if status == "optimal" else None)
    return _Outcome(status, x, bound, highs.modelStatusToString(model_status))


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
