"""Networks whose maximum over a box is known exactly, for verifier tests at the decision boundary.

Two families:

* **Peaks** (:func:`peak_network`): a first layer that is active on the whole box (so it is
  affine there), then a layer computing |z| = relu(z) + relu(−z) of an affine map z that
  vanishes at one point x* inside the box, then heads ``y_i = h_i − s·‖z_i‖₁``. The maximum of
  every head is exactly h_i, reached only at x* (the map x ↦ z_i is injective), whatever the
  rounding of the weights. Violations of ``y_i ≥ h_i − 10⁻⁴`` fill a region of diameter
  ~10⁻⁵ around x*: sampling does not find it, a search that refutes boxes with a small
  positive upper bound misses it.
* **Single linear regions** (:func:`linear_region_problem`): a random network on a box so small
  that no ReLU changes sign in it; the network is affine there and the maximum of a row is
  its value at the corner picked by the signs of the row's gradient.

Both answer the max up to float64 evaluation error (≤ 10⁻¹²), far below the 10⁻⁴ offsets used.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from assay.bounds import compute_bounds
from assay.nn import Linear, Network, ReLU

OFFSET = 1e-4


def _tensor(values) -> torch.Tensor:
    return torch.as_tensor(np.asarray(values, dtype=np.float64))


def peak_network(n: int, seed: int, heights=(2.0,), slope: float = 4.0) -> tuple[Network, np.ndarray]:
    """A network on [-1, 1]^n whose output i has maximum exactly ``heights[i]``, at x* (returned).

    Hidden layers: n + 2 neurons active on the whole box, then 2n per head (|z| of n values).
    """
    rng = np.random.default_rng(seed)
    peak = rng.uniform(-0.6, 0.6, n)
    first = rng.normal(0, 1, (n + 2, n))
    first_bias = np.abs(first).sum(1) + 1.0  # ≥ 1 on the whole box: these ReLUs never switch off
    hidden_at_peak = first @ peak + first_bias
    rows, biases = [], []
    for _ in heights:
        while True:
            mix = rng.normal(0, 1, (n, n + 2))
            if abs(np.linalg.det(mix @ first)) > 0.1:  # x ↦ z is injective: |z| = 0 only at x*
                break
        rows += [mix, -mix]
        biases += [-(mix @ hidden_at_peak), mix @ hidden_at_peak]
    abs_weight, abs_bias = np.concatenate(rows), np.concatenate(biases)
    per_head = 2 * n
    head_weight = np.zeros((len(heights), abs_weight.shape[0]))
    for i in range(len(heights)):
        head_weight[i, i * per_head:(i + 1) * per_head] = -slope
    layers = (Linear(_tensor(first), _tensor(first_bias)), ReLU(), Linear(_tensor(abs_weight), _tensor(abs_bias)), ReLU(),
              Linear(_tensor(head_weight), _tensor(heights)))
    return Network(layers, (n,)), peak


def unit_box(n: int, radius: float = 1.0) -> SimpleNamespace:
    return SimpleNamespace(lower=-radius * torch.ones(n, dtype=torch.float64),
                           upper=radius * torch.ones(n, dtype=torch.float64))


def at_least(outputs: int, *conjunctions) -> SimpleNamespace:
    """An unsafe region: OR over ``conjunctions``, each a list of (output, threshold) meaning y_output ≥ threshold."""
    parts = []
    for conjunction in conjunctions:
        C = torch.zeros(len(conjunction), outputs, dtype=torch.float64)
        d = torch.zeros(len(conjunction), dtype=torch.float64)
        for row, (output, threshold) in enumerate(conjunction):
            C[row, output] = 1.0
            d[row] = -threshold
        parts.append(SimpleNamespace(C=C, d=d))
    return SimpleNamespace(conjunctions=tuple(parts))


def at_most(outputs: int, conjunction) -> SimpleNamespace:
    """A required region: every (output, threshold) in ``conjunction`` has y_output ≤ threshold."""
    C = torch.zeros(len(conjunction), outputs, dtype=torch.float64)
    d = torch.zeros(len(conjunction), dtype=torch.float64)
    for row, (output, threshold) in enumerate(conjunction):
        C[row, output] = -1.0
        d[row] = threshold
    return SimpleNamespace(conjunctions=(SimpleNamespace(C=C, d=d),))


def samples_near(point: np.ndarray, box, rng: np.random.Generator, count: int = 100_000) -> torch.Tensor:
    """Fresh points: half uniform over the box, half within ~10⁻⁵…10⁻² of ``point`` (clipped to the box)."""
    lower, upper = box.lower.numpy(), box.upper.numpy()
    uniform = rng.uniform(lower, upper, (count // 2, lower.size))
    scales = 10.0 ** rng.uniform(-5, -2, (count - count // 2, 1))
    near = np.clip(point + scales * rng.normal(0, 1, (count - count // 2, lower.size)), lower, upper)
    return torch.as_tensor(np.concatenate([uniform, near]))


def linear_region_problem(network: Network, seed: int, radius: float = 0.02):
    """A box around a random point where every ReLU of ``network`` is stable, and the exact
    maximum of each output over it with its maximiser: (box, maxima (n_out,), maximisers (n_out, n))."""
    rng = np.random.default_rng(seed)
    n = network.input_size
    for _ in range(1000):
        center = rng.uniform(-0.8, 0.8, n)
        box = SimpleNamespace(lower=_tensor(center - radius), upper=_tensor(center + radius))
        bounds = compute_bounds(network, (box.lower.unsqueeze(0), box.upper.unsqueeze(0)), method="ibp")
        if all(((lo >= 0) | (hi <= 0)).all() for lo, hi in zip(bounds.intermediate.lower, bounds.intermediate.upper)):
            break
    else:  # pragma: no cover - the radius is small enough for the networks used
        raise AssertionError("no box with only stable ReLUs found")
    model = network.to_torch().to(torch.float64)
    x = torch.as_tensor(center).reshape(1, n).requires_grad_(True)
    outputs = model(x).reshape(-1)
    maxima, maximisers = [], []
    for i in range(outputs.numel()):
        (gradient,) = torch.autograd.grad(outputs[i], x, retain_graph=True)
        corner = torch.where(gradient.reshape(-1) > 0, box.upper, box.lower)
        maximisers.append(corner)
        maxima.append(float(network.forward(corner.reshape(1, n)).reshape(-1)[i]))
    return box, np.array(maxima), torch.stack(maximisers)
