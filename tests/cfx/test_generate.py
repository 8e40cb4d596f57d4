"""Algorithm 2 (robust counterfactuals): MILP-R's answers are proven robust and survive sampling;
the APΔS variant states a union bound over the candidates it tested."""

from __future__ import annotations

import numpy as np
import pytest

from assay.cfx import counterfactual, delta_robust, robust_counterfactual
from assay.cfx._model import target_rows
from tests.cfx.nets import parameter_count, random_mlp, shifted_outputs


@pytest.mark.parametrize("seed", range(4))
def test_milp_r_is_proven_robust_and_never_refuted_by_sampling(seed):
    rng = np.random.default_rng(200 + seed)
    network = random_mlp((4, 6, 1), rng)
    x = rng.uniform(0, 1, size=4)
    delta = 0.03
    result = robust_counterfactual(network, x, delta)
    plain = counterfactual(network, x)
    assert result.test == "exact"
    if result.counterfactual.x_cf is None:  # no counterfactual at all: said so, not robust
        assert result.candidates == 0 and result.counterfactual.status == "infeasible"
        assert not result.robust and "no counterfactual" in result.guarantee
        return
    if not result.robust:
        assert result.confidence == 0.0
        return
    cf = result.x_cf
    assert delta_robust(network, cf, delta, result.counterfactual.target, method="milp").robust
    assert result.counterfactual.distance >= plain.distance - 1e-9
    C = target_rows(network, result.counterfactual.target)
    P = parameter_count(network)
    for signs in (rng.uniform(-1, 1, size=(5000, P)), rng.choice([-1.0, 1.0], size=(5000, P))):
        assert (shifted_outputs(network, cf, signs, delta) @ C.T).min() > 0
    assert result.confidence == 1.0 and "proven" in result.guarantee
    assert result.to_json()["counterfactual"]["x_cf"] == cf.tolist()


def test_apas_generation_states_its_union_bound():
    rng = np.random.default_rng(21)
    network = random_mlp((4, 6, 1), rng)
    x = rng.uniform(0, 1, size=4)
    result = robust_counterfactual(network, x, 0.05, test="apas", rng=np.random.default_rng(0))
    assert result.robust
    k = result.candidates
    assert result.confidence == pytest.approx(1 - k * 0.995 ** 1379)
    assert f"{k} candidate" in result.guarantee and "union bound" in result.guarantee
    exact = robust_counterfactual(network, x, 0.05)
    # The probabilistic test is weaker, so its answer costs at most what MILP-R's costs.
    assert result.counterfactual.distance <= exact.counterfactual.distance + 1e-9


def test_schedule_exhausted_is_reported_not_robust():
    rng = np.random.default_rng(2)
    network = random_mlp((3, 4, 1), rng)
    x = rng.uniform(0, 1, size=3)
    result = robust_counterfactual(network, x, 5.0, max_margin=0.5)
    assert not result.robust and result.confidence == 0.0
    assert result.candidates == 3  # margins 0.01, 0.21, 0.41


def _vertex_worst_on_grid(network, grid, vertices, delta, C):
    """min over the vertex models of min_r C_r f'(p), for every grid point p (one hidden layer)."""
    import torch

    from tests.cfx.nets import parameters

    (W1, b1), (W2, b2) = parameters(network)
    s = torch.as_tensor(vertices) * delta
    h_out, inputs = W1.shape
    cut = [h_out * inputs, h_out, W2.size, W2.shape[0]]
    parts = torch.split(s, cut, dim=1)
    W1s = torch.as_tensor(W1) + parts[0].reshape(-1, h_out, inputs)
    b1s = torch.as_tensor(b1) + parts[1]
    W2s = torch.as_tensor(W2) + parts[2].reshape(-1, *W2.shape)
    b2s = torch.as_tensor(b2) + parts[3]
    points = torch.as_tensor(grid)
    hidden = torch.relu(torch.einsum("vhi,pi->vph", W1s, points) + b1s[:, None, :])
    out = torch.einsum("voh,vph->vpo", W2s, hidden) + b2s[:, None, :]
    return (out.numpy() @ C.T).min(axis=(0, 2))


@pytest.mark.parametrize("seed", [300, 303, 308, 315])  # 300: no robust counterfactual exists
def test_nearest_robust_counterfactual_is_robust_and_nearest_on_a_grid(seed):
    from assay.cfx import nearest_robust_counterfactual
    from tests.cfx.nets import all_vertices

    rng = np.random.default_rng(seed)
    network = random_mlp((2, 3, 1), rng)
    x = rng.uniform(0, 1, size=2)
    target = 1 - int(network.forward(x[None])[0, 0] > 0)
    delta = 0.05
    direct = nearest_robust_counterfactual(network, x, delta, target=target)
    g = np.linspace(0, 1, 26)
    grid = np.stack(np.meshgrid(g, g), -1).reshape(-1, 2)
    C = target_rows(network, target)
    vertices = all_vertices(parameter_count(network))
    worst = _vertex_worst_on_grid(network, grid, vertices, delta, C)
    robust_points = grid[worst >= 1e-4]
    if not direct.robust:
        assert direct.counterfactual.status == "infeasible" and len(robust_points) == 0
        return
    cf = direct.x_cf
    assert (shifted_outputs(network, cf, vertices, delta) @ C.T).min() > 0
    assert direct.counterfactual.optimal and direct.candidates == 1
    best_on_grid = np.abs(robust_points - x).sum(1).min() if len(robust_points) else np.inf
    assert direct.counterfactual.distance <= best_on_grid + 1e-9
    milp_r = robust_counterfactual(network, x, delta, target=target, margin_step=0.05)
    if milp_r.robust:
        assert direct.counterfactual.distance <= milp_r.counterfactual.distance + 1e-9


def test_nearest_robust_counterfactual_multiclass_against_vertices():
    from assay.cfx import nearest_robust_counterfactual
    from tests.cfx.nets import all_vertices

    found = 0
    for seed in (400, 404, 406, 431):  # 400: no robust counterfactual of the next class
        rng = np.random.default_rng(seed)
        network = random_mlp((2, 2, 3), rng)  # 15 parameters: every vertex model
        x = rng.uniform(0, 1, size=2)
        source = int(network.forward(x[None])[0].argmax())
        target = (source + 1) % 3
        C = target_rows(network, target)
        result = nearest_robust_counterfactual(network, x, 0.03, target=target)
        g = np.linspace(0, 1, 17)
        grid = np.stack(np.meshgrid(g, g), -1).reshape(-1, 2)
        worst = _vertex_worst_on_grid(network, grid, all_vertices(parameter_count(network)), 0.03, C)
        robust_points = grid[worst >= 1e-4]
        if not result.robust:
            assert result.counterfactual.status == "infeasible" and len(robust_points) == 0
            continue
        found += 1
        cf_worst = _vertex_worst_on_grid(network, result.x_cf[None], all_vertices(parameter_count(network)), 0.03, C)
        assert cf_worst[0] > 0
        if len(robust_points):
            assert result.counterfactual.distance <= np.abs(robust_points - x).sum(1).min() + 1e-9
    assert found == 3
