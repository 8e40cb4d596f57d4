"""The registry of bound methods: one list for every caller, plug-in relaxations stay sound."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import assay.bounds
from assay.bounds import METHODS, BoundMethod, compute_bounds, method_names
from assay.bounds.relaxation import ReluRelaxation, relax_relu
from assay.errors import OptionError
from assay.nn import Linear, Network, ReLU

from .strategies import forward_batched, sample_box

PUBLIC = {
    "compute_bounds", "METHODS", "BoundMethod", "bound_method", "method_names", "BoundsResult", "LinearBounds",
    "IntermediateBounds", "AlphaCrownOptions", "BetaCrownOptions", "Plan", "plan_for", "interval_pass",
    "center_radius", "relax_relu", "backsubstitute", "concretize", "optimize_bounds", "GradientBounds",
    "gradient_bounds", "lipschitz_bounds", "input_sensitivities", "affine_forms", "pattern_lower_bound",
    "ReluCoefficients", "relu_coefficients", "split_child_bounds", "SplitCandidates", "split_candidates", "intermediate_method_for",
}


def test_public_names_are_pinned_and_documented():
    assert set(assay.bounds.__all__) == PUBLIC and len(assay.bounds.__all__) == len(PUBLIC)
    for name in PUBLIC:
        assert getattr(assay.bounds, name).__doc__, name


def test_every_method_list_reads_the_registry():
    from assay.cli import bounds_cmd
    from assay.demo import _METHODS as demo_methods
    from assay.verify.options import INPUT_SPLIT_METHODS

    assert method_names() == ("ibp", "crown", "alpha", "beta")
    assert bounds_cmd._METHODS == demo_methods == method_names()
    # Input splitting shrinks boxes by the rows' linear bounds, so interval-only methods are not offered.
    assert INPUT_SPLIT_METHODS == tuple(name for name in method_names()
                                        if not METHODS[name].for_splits and METHODS[name].linear)
    assert INPUT_SPLIT_METHODS == ("crown", "alpha")
    with pytest.raises(OptionError, match="must be one of 'ibp', 'crown', 'alpha', 'beta'; got 'gamma'"):
        compute_bounds(Network((Linear(torch.ones(1, 1), torch.zeros(1)),), (1,)), (torch.zeros(1), torch.ones(1)),
                       method="gamma")


def zero_slope(lower, upper) -> ReluRelaxation:
    """CROWN's chord above, but always the zero line below: sound, looser than CROWN's choice."""
    crown = relax_relu(lower, upper)
    lower_slope = torch.where(crown.unstable, torch.zeros_like(crown.lower_slope), crown.lower_slope)
    return dataclasses.replace(crown, lower_slope=lower_slope)


def test_a_plugged_in_relaxation_is_used_and_stays_sound(monkeypatch, rng):
    torch.manual_seed(5)
    network = Network((Linear(torch.randn(8, 3), torch.randn(8)), ReLU(), Linear(torch.randn(8, 8), torch.randn(8)),
                       ReLU(), Linear(torch.randn(2, 8), torch.randn(2))), (3,))
    monkeypatch.setitem(METHODS, "crown0", BoundMethod("crown0", "CROWN-0", "CROWN, lower slope 0", linear=True,
                                                       relaxation=zero_slope))
    lower, upper = -torch.ones(16, 3), torch.ones(16, 3)
    plugged = compute_bounds(network, (lower, upper), method="crown0")
    crown = compute_bounds(network, (lower, upper), method="crown")
    y = forward_batched(network, sample_box(lower, upper, rng, 4000))
    assert (y >= plugged.lower).all() and (y <= plugged.upper).all()
    assert not torch.allclose(plugged.lower, crown.lower)  # the relaxation really changed the bounds
    assert plugged.method == "crown0"


def test_no_public_name_of_a_lazy_package_is_also_a_submodule():
    """Importing a submodule sets the package attribute of its name: a public function of the
    same name (loaded lazily) would then read as the module, wherever that import came first."""
    import pkgutil

    import assay.bounds
    import assay.datasets
    import assay.monitor.frnn
    import assay.verify

    for package in (assay.bounds, assay.datasets, assay.monitor.frnn, assay.verify):
        submodules = {info.name for info in pkgutil.iter_modules(package.__path__)}
        assert not submodules & set(package.__all__), package.__name__
