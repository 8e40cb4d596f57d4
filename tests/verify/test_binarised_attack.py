"""PGD on binarised networks (``Sign`` layers, larq's ``sign(sign(x) + 0.1)``): the attack model's
forward pass is the network's, its gradients come from surrogates, and a final Softmax is
dropped only where the query's rows are pure differences."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from assay.nn import Linear, Network
from assay.nn.ops.activation import Sign
from assay.nn.ops.arith import Affine
from assay.nn.ops.softmax import Softmax
from assay.sets import Box, HalfSpaces, OutputSpec
from assay.verify import VerificationStatus, attack, verify
from assay.verify.attack_model import attack_model, drops_softmax, has_sign, sign_roles
from assay.verify.problem import from_unsafe

N = 8
THRESHOLD = 0.7


def _binarised(softmax: bool = True) -> Network:
    """x ∈ R^8 → h = sign(sign(x − 0.7) + 0.1) → y = (Σ h, 7) [→ softmax]. y0 ≥ y1 iff every
    x_i > 0.7 (Σ h = 8): a corner of the box [0, 1]^8 that sampling rarely hits (0.3^8)."""
    layers = [
        Linear(torch.eye(N), torch.full((N,), -THRESHOLD, dtype=torch.float64)),
        Sign(),
        Affine(torch.ones(N), torch.full((N,), 0.1)),
        Sign(),
        Linear(torch.stack([torch.ones(N), torch.zeros(N)]), torch.tensor([0.0, 7.0])),
    ]
    if softmax:
        layers.append(Softmax(0))
    return Network(tuple(layers), (N,))


def _spec(C, d) -> OutputSpec:
    return OutputSpec((HalfSpaces(np.atleast_2d(np.asarray(C, dtype=float)), np.atleast_1d(np.asarray(d, dtype=float))),))


def _query(network: Network, C, d, lower=0.0, upper=1.0):
    box = Box(np.full(N, lower), np.full(N, upper))
    return from_unsafe(network, box, _spec(np.atleast_2d(C), np.atleast_1d(d)))[0]


def _difference_query(network, lower=0.0, upper=1.0):
    return _query(network, [1.0, -1.0], [0.0], lower, upper)  # y0 − y1 ≥ 0


def test_the_roles_of_the_sign_layers():
    network = _binarised()
    assert has_sign(network)
    assert sign_roles(network) == {1: "surrogate", 3: "straight"}


def test_the_attack_models_forward_pass_is_the_networks_exactly():
    network = _binarised(softmax=False)
    query = _difference_query(network)
    model = attack_model(network, query, torch.float64)
    rng = np.random.default_rng(0)
    x = torch.as_tensor(rng.uniform(size=(64, N)))
    x[0] = THRESHOLD  # every pre-activation exactly 0: sign(0) = 0, then sign(0.1) = 1
    x[1, :4] = THRESHOLD
    assert (network.tensors(x)[1][0] == 0).all()
    with torch.no_grad():
        assert torch.equal(model(x), network.forward(x))
        # every tensor, not only the output (the larq pattern maps sign(0) = 0 and 1 alike to 1)
        values, tensors = x, network.tensors(x)
        for index, module in enumerate(model):
            values = module(values)
            assert torch.equal(values, tensors[index + 1]), f"layer {index}"
    # float32 too: the attack reads the margin of the float32 network
    model32 = attack_model(network, query, torch.float32)
    with torch.no_grad():
        assert torch.equal(model32(x.to(torch.float32)), network.forward(x, dtype="float32"))


def test_a_bare_sign_keeps_sign_0_equal_to_0():
    """sign(W x + b) read by a Linear directly: sign(0) = 0 (ONNX), not ±1, in the attack model too."""
    network = Network((Linear(torch.eye(N), torch.full((N,), -THRESHOLD, dtype=torch.float64)), Sign(),
                       Linear(torch.ones(1, N), torch.zeros(1))), (N,))
    query = _query(network, [1.0], [0.0])
    x = torch.full((1, N), THRESHOLD, dtype=torch.float64)
    x[0, 0] = 1.0
    with torch.no_grad():
        assert float(network.forward(x)[0, 0]) == 1.0
        assert torch.equal(attack_model(network, query, torch.float64)(x), network.forward(x))


def test_with_softmax_kept_the_forward_pass_is_the_networks_and_dropped_it_is_the_logits():
    network = _binarised()
    x = torch.as_tensor(np.random.default_rng(1).uniform(size=(32, N)))
    threshold = _query(network, [1.0, 0.0], [-0.5])  # y0 ≥ 0.5: a probability threshold
    assert not drops_softmax(network, threshold)
    with torch.no_grad():
        assert torch.equal(attack_model(network, threshold, torch.float64)(x), network.forward(x))
    difference = _difference_query(network)
    assert drops_softmax(network, difference)
    with torch.no_grad():
        logits = network.tensors(x)[-2]
        assert torch.equal(attack_model(network, difference, torch.float64)(x), logits)


@pytest.mark.parametrize("C,d,drops", [
    ([1.0, -1.0], [0.0], True),
    ([[1.0, -1.0], [-1.0, 1.0]], [0.0, 0.0], True),
    ([1.0, -1.0], [0.01], False),   # an offset: y0 − y1 + d compares differently after softmax
    ([2.0, -2.0], [0.0], False),    # not ±1 (the same comparison, but the rule stays simple)
    ([1.0, 0.0], [-0.5], False),    # a threshold on one probability
    ([-1.0, 0.0], [0.0], False),
    ([1.0, -0.5], [0.0], False),
])
def test_softmax_is_dropped_only_for_pure_differences(C, d, drops):
    network = _binarised()
    assert drops_softmax(network, _query(network, C, d)) is drops


def test_softmax_is_kept_when_it_is_not_the_last_layer_or_covers_part_of_the_output():
    inner = Network((Linear(torch.eye(2), torch.zeros(2)), Softmax(0), Linear(torch.eye(2), torch.zeros(2))), (2,))
    box = Box(np.zeros(2), np.ones(2))
    query = from_unsafe(inner, box, _spec(np.array([[1.0, -1.0]]), np.array([0.0])))[0]
    assert not drops_softmax(inner, query)
    from assay.nn.layers import Reshape
    rows = Network((Linear(torch.eye(4), torch.zeros(4)), Reshape((2, 2)), Softmax(1)), (4,))  # softmax per row
    box = Box(np.zeros(4), np.ones(4))
    query = from_unsafe(rows, box, _spec(np.array([[1.0, 0.0, -1.0, 0.0]]), np.array([0.0])))[0]
    assert not drops_softmax(rows, query)


def test_plain_pgd_is_stuck_and_the_surrogate_finds_the_violation(monkeypatch):
    network = _binarised()
    query = _difference_query(network)
    centre = ((query.lower + query.upper) / 2).reshape(1, -1)
    assert not bool(query.violates(network.forward(centre).reshape(1, -1))[0])
    found = attack.from_center(network, query)
    assert found is not None
    x, y = found
    assert ((x >= query.lower) & (x <= query.upper)).all()
    assert bool(query.violates(network.forward(x.reshape(1, N)).reshape(1, -1))[0])
    assert (x > THRESHOLD).all()

    def plain(net, q, dtype=torch.float32):  # the network's own gradients: zero through every Sign
        model = net.to_torch().to(dtype)
        for parameter in model.parameters():
            parameter.requires_grad_(False)
        return model

    monkeypatch.setattr(attack, "attack_model", plain)
    attack._MODELS.clear()
    try:
        assert attack.from_center(network, query) is None
    finally:
        attack._MODELS.clear()


def test_binarised_networks_get_the_long_schedule():
    assert [count for _, _, count in attack.schedules(_binarised())] == [100, 300, 50]
    relu = Network((Linear(torch.eye(2), torch.zeros(2)),), (2,))
    assert len(attack.schedules(relu)) == 2


def test_verify_finds_the_violation_and_never_reports_a_holding_property_violated():
    network = _binarised()
    unsafe = _spec([1.0, -1.0], [0.0])
    result = verify(network, Box(np.zeros(N), np.ones(N)), unsafe=unsafe, timeout=20)
    assert result.status is VerificationStatus.VIOLATED
    x = torch.as_tensor(result.counterexample.input).reshape(1, N)
    assert bool(network.forward(x)[0, 0] >= network.forward(x)[0, 1])
    # On [0, 0.69]^8 every h_i = −1: y0 = −8 < 7 = y1 everywhere, so the property holds; input
    # splitting (8 inputs) proves it, every Sign being stable on the box.
    safe = verify(network, Box(np.zeros(N), np.full(N, 0.69)), unsafe=unsafe, timeout=20)
    assert safe.status is VerificationStatus.HOLDS
    assert safe.counterexample is None


def test_the_operator_split_of_a_binarised_network_on_a_short_deadline_attacks_and_times_out(monkeypatch):
    import assay.verify.api as api

    network = _binarised()
    unsafe = _spec([1.0, -1.0], [0.0])
    # PGD from the centre answers at once here, so that the restarts surely get time on a loaded machine
    monkeypatch.setattr(api, "from_center", lambda *args, **kwargs: None)
    safe = verify(network, Box(np.zeros(N), np.full(N, 0.69)), unsafe=unsafe, timeout=3, strategy="operator")
    assert safe.status is VerificationStatus.TIMEOUT
    assert safe.counterexample is None and "binarised" in safe.reason
    assert safe.stats.attacks == 2 and safe.stats.bound_calls == 0  # PGD from the centre, then restarts
    monkeypatch.undo()
    found = verify(network, Box(np.zeros(N), np.ones(N)), unsafe=unsafe, timeout=20, strategy="operator")
    assert found.status is VerificationStatus.VIOLATED
