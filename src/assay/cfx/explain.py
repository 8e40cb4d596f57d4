"""One call per input for the ``assay cfx`` command: a counterfactual and, if asked, its robustness.

:func:`explain` picks what :func:`assay.cfx.counterfactual`, :func:`robust_counterfactual`,
:func:`delta_robust` and :func:`apas` to run from the options and returns one
:class:`Explanation`; :func:`read_input_rows` reads a JSON input or a CSV batch of inputs (the bad rows
apart), :func:`read_inputs` the same, refusing the first bad row; :func:`write_onnx`
saves a Linear/ReLU network (e.g. a scikit-learn MLP loaded with :func:`assay.nn.load`) as an ONNX
file the command can read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from assay.cfx.apas import ApasResult, apas
from assay.cfx.features import FeatureTypes
from assay.cfx.generate import RobustCounterfactual, robust_counterfactual
from assay.cfx.milp import Counterfactual, counterfactual, default_target
from assay.cfx.robustness import DeltaRobustness, delta_robust
from assay.datasets.csv_rows import NumericRows
from assay.errors import DataError, OptionError

__all__ = ["Explanation", "explain", "read_inputs", "read_input_rows", "write_onnx"]


@dataclass(frozen=True)
class Explanation:
    """A counterfactual and what was checked about it.

    Attributes:
        counterfactual: the counterfactual returned (the robust one under ``robust``).
        robust: the Algorithm 2 run (``--robust``), or None.
        delta_check: the exact Δ-robustness check at ``--delta`` of a plain counterfactual, or None.
        apas: APΔS's largest δ for the counterfactual (``--apas`` without ``--robust``), or None.
    """

    counterfactual: Counterfactual
    robust: RobustCounterfactual | None = None
    delta_check: DeltaRobustness | None = None
    apas: ApasResult | None = None

    def to_json(self) -> dict:
        return {"counterfactual": self.counterfactual.to_json(),
                "robust": None if self.robust is None else {k: v for k, v in self.robust.to_json().items()
                                                           if k != "counterfactual"},
                "delta_check": None if self.delta_check is None else self.delta_check.to_json(),
                "apas": None if self.apas is None else self.apas.to_json()}


def explain(network, x, *, features: FeatureTypes | None = None, target: int | None = None, distance: str = "l1",
            margin: float = 0.0, robust: bool = False, delta: float | None = None, use_apas: bool = False,
            R: float = 0.995, alpha: float = 0.999, rng: np.random.Generator | None = None,
            time_limit: float | None = None, direct: bool = False, samples: int | None = None) -> Explanation:
    """The counterfactual of ``x`` and the checks the options ask for.

    * ``robust`` (needs ``delta``): Algorithm 2 with the exact test, or with APΔS when ``use_apas``;
      with ``direct``, the nearest Δ-robust counterfactual by one MILP (one-hidden-layer networks).
    * otherwise the nearest counterfactual, then: with ``delta`` its exact Δ-robustness at δ, and
      with ``use_apas`` the largest δ with APΔS's (R, α) guarantee.
    * ``samples`` overrides APΔS's sample size n (default ⌈log(1 − α) / log R⌉); the guarantee
      then carries the confidence 1 − Rⁿ of that n, which the result states.
    """
    if samples is not None and not use_apas:
        raise OptionError("--samples sets the APΔS test's sample size; it needs --apas")
    if samples is not None and (isinstance(samples, bool) or not isinstance(samples, (int, np.integer)) or samples < 1):
        raise OptionError(f"--samples must be an integer ≥ 1; got {samples!r}")
    if robust and delta is None:
        raise OptionError("--robust needs --delta D: the weight change the counterfactual must survive")
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    if target is None:
        target = default_target(network, x)
    if robust and direct:
        if use_apas:
            raise OptionError("--direct finds a proven robust counterfactual; it does not combine with --apas")
        from assay.cfx.robust_milp import nearest_robust_counterfactual

        result = nearest_robust_counterfactual(network, x, delta, features=features, target=target, distance=distance,
                                               margin=margin, time_limit=time_limit)
        return Explanation(result.counterfactual, robust=result)
    if direct:
        raise OptionError("--direct works with --robust --delta D")
    if robust:
        result = robust_counterfactual(network, x, delta, test="apas" if use_apas else "exact", features=features,
                                       target=target, distance=distance, initial_margin=max(margin, 0.01), R=R,
                                       alpha=alpha, rng=rng, time_limit=time_limit, samples=samples)
        return Explanation(result.counterfactual, robust=result)
    found = counterfactual(network, x, distance, features, target, margin, time_limit=time_limit)
    check = apas_result = None
    if found.found and delta is not None:
        check = delta_robust(network, found.x_cf, delta, target, time_limit=time_limit)
    if found.found and use_apas:
        apas_result = apas(network, found.x_cf, target, R, alpha, rng=rng, samples=samples)
    return Explanation(found, delta_check=check, apas=apas_result)


def read_inputs(path, size: int, features: FeatureTypes | None = None, positional: bool = False) -> np.ndarray:
    """Inputs as a (rows, size) array (see :func:`read_input_rows`); the first bad row raises DataError."""
    found = read_input_rows(path, size, features, positional)
    if found.bad:
        raise DataError(str(found.bad[0]))
    return found.values


def read_input_rows(path, size: int, features: FeatureTypes | None = None, positional: bool = False) -> NumericRows:
    """The inputs of a JSON or CSV file (the suffix decides), with the rows that could not be read.

    * JSON: a list of numbers, a list of lists, or ``{"x": [...]}``; any problem refuses the file
      (``rows`` and ``lines`` then both count the lists, 1-based).
    * CSV with a header (:mod:`assay.datasets.csv_rows`): a batch. When the feature spec names its
      variables, the columns are taken by those names (in any order, other columns ignored), and a
      header without every name is an error listing both, unless ``positional``: then, as without
      names, the header must have one column per input and they are read in order. A ragged,
      non-numeric or NaN row is returned in ``bad`` (the others are read).

    Raises:
        DataError: the file is missing, not JSON / not UTF-8 / not CSV, or its header does not fit.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file; pass a JSON list of {size} numbers (--input) or a CSV (--inputs)")
    if path.suffix.lower() == ".json":
        rows = _json_inputs(path, size)
        numbers = tuple(range(1, len(rows) + 1))
        return NumericRows(rows, numbers, numbers, ())
    from assay.datasets.csv_rows import numeric_rows, read_csv_table

    table = read_csv_table(path)
    names = list(features.names) if features is not None and features.names is not None else None
    if names and not positional:
        if not all(name in table.header for name in names):
            raise DataError(f"{path}: the header names {', '.join(table.header)}, but the feature spec names "
                            f"{', '.join(names)}; rename the columns to the spec's names, or pass --positional to "
                            f"read the first {size} columns in order")
        columns = [table.header.index(name) for name in names]
    else:
        if len(table.header) != size:
            raise DataError(f"{path}: the header has {len(table.header)} columns ({', '.join(table.header)[:200]}), "
                            f"but the model takes {size} inputs; give one column per input, in the model's order")
        columns = list(range(size))
    return numeric_rows(table, columns)


def _json_inputs(path: Path, size: int) -> np.ndarray:
    try:
        payload = json.loads(path.read_bytes().decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 text; save the JSON file as UTF-8") from exc
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON ({exc}); write a list of {size} numbers") from None
    except RecursionError:
        raise DataError(f"{path}: the JSON nests too deeply; write a list of {size} numbers") from None
    if isinstance(payload, dict):
        payload = payload.get("x", payload.get("inputs"))
    try:
        rows = np.atleast_2d(np.asarray(payload, dtype=np.float64))
    except (TypeError, ValueError, OverflowError, RecursionError):
        raise DataError(f"{path}: expected a list of {size} numbers (or {{\"x\": [...]}}); got something else") from None
    if rows.ndim != 2 or rows.shape[1] != size:
        raise DataError(f"{path}: each input needs {size} values (the model's inputs); got shape {rows.shape}")
    if not np.isfinite(rows).all():
        raise DataError(f"{path}: NaN or infinite values in row {int(np.flatnonzero(~np.isfinite(rows).all(1))[0]) + 1}")
    return rows


def write_onnx(network, path) -> Path:
    """Save a Linear/ReLU chain over a flat input as ONNX (float64 Gemm/Relu nodes)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from assay.cfx._model import check_mlp

    affine = check_mlp(network, "write_onnx")
    nodes, initializers, current = [], [], "input"
    for k, (W, b) in enumerate(affine):
        initializers += [numpy_helper.from_array(np.asarray(W, np.float64), f"W{k}"),
                         numpy_helper.from_array(np.asarray(b, np.float64), f"b{k}")]
        out = "output" if k == len(affine) - 1 else f"z{k}"
        nodes.append(helper.make_node("Gemm", [current, f"W{k}", f"b{k}"], [out], name=f"linear{k}", transB=1))
        if k < len(affine) - 1:
            nodes.append(helper.make_node("Relu", [out], [f"h{k}"], name=f"relu{k}"))
            current = f"h{k}"
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("input", TensorProto.DOUBLE, [1, network.input_size])],
                              [helper.make_tensor_value_info("output", TensorProto.DOUBLE, [1, network.output_size])],
                              initializers)
    path = Path(path)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path
