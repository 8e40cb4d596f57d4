"""The torch, scikit-learn and .nnet loaders against their own forward passes."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from scipy.special import expit, logit
from torch import nn

from assay.errors import ModelLoadError, UnsupportedOperatorError
from assay.nn import Conv2d, Linear, ReLU, load
from assay.nn.load import nnet_input_bounds


# ---------------------------------------------------------------------- torch
def randomise_batchnorm(model: nn.Module, generator: torch.Generator) -> None:
    for module in model.modules():
        if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d)):
            size = module.num_features
            module.running_mean.copy_(torch.randn(size, generator=generator))
            module.running_var.copy_(torch.rand(size, generator=generator) + 0.5)
            module.weight.data.copy_(torch.randn(size, generator=generator))
            module.bias.data.copy_(torch.randn(size, generator=generator))


def test_torch_sequential_matches_torch(rng):
    generator = torch.Generator().manual_seed(5)
    torch.manual_seed(5)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding="same", groups=4, bias=False),
        nn.ReLU(),
        nn.AvgPool2d(2),
        nn.Flatten(),
        nn.Dropout(0.3),
        nn.Linear(8 * 4 * 4, 16),
        nn.BatchNorm1d(16),
        nn.ReLU(inplace=True),
        nn.Sequential(nn.Linear(16, 6), nn.Identity(), nn.Sequential(nn.ReLU(), nn.Linear(6, 3))),
    )
    randomise_batchnorm(model, generator)
    model.eval()
    network = load(model, input_shape=(3, 16, 16))
    assert network.source == "torch.nn.Sequential" and network.input_shape == (3, 16, 16)
    assert sum(isinstance(layer, Conv2d) for layer in network.layers) == 2  # batch norms folded
    x = torch.as_tensor(rng.normal(size=(10, 3, 16, 16)))
    with torch.no_grad():
        expected = model.double()(x)
    np.testing.assert_allclose(network.forward(x).numpy(), expected.numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(network.forward(x, "float32").numpy(), expected.numpy(), rtol=1e-4, atol=1e-4)


def test_torch_batchnorm_first_folds_forward_into_the_linear_layer(rng):
    model = nn.Sequential(nn.BatchNorm1d(4), nn.Linear(4, 3), nn.ReLU(), nn.BatchNorm1d(3), nn.ReLU())
    randomise_batchnorm(model, torch.Generator().manual_seed(2))
    model.eval()
    network = load(model, input_shape=(4,))
    # leading BN folds into the Linear; the BN after a ReLU becomes an explicit diagonal layer
    assert [type(layer) for layer in network.layers] == [Linear, ReLU, Linear, ReLU]
    x = torch.as_tensor(rng.normal(size=(8, 4)))
    with torch.no_grad():
        np.testing.assert_allclose(network.forward(x).numpy(), model.double()(x).numpy(), rtol=1e-10, atol=1e-10)


def test_torch_unsupported_module_names_class_and_position():
    model = nn.Sequential(nn.Linear(3, 4), nn.Sequential(nn.ReLU(), nn.Tanh()), nn.Linear(4, 1))
    with pytest.raises(UnsupportedOperatorError) as info:
        load(model, input_shape=(3,))
    message = str(info.value)
    assert "Tanh" in message and "module 2" in message and "'1.1'" in message and "Linear" in message


def test_torch_needs_input_shape_and_eval_mode():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    with pytest.raises(ModelLoadError, match="input_shape is required"):
        load(model)
    with pytest.raises(ModelLoadError, match=r"model\.eval\(\)"):
        load(model.train(), input_shape=(3,))
    with pytest.raises(ModelLoadError, match="takes 3 inputs"):
        load(model.eval(), input_shape=(5,))


def test_torch_custom_module_is_unsupported():
    class Net(nn.Module):
        def forward(self, x):
            return x

    with pytest.raises(UnsupportedOperatorError, match="Net"):
        load(Net(), input_shape=(2,))


# ---------------------------------------------------------------------- scikit-learn
def fitted(estimator, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning: a few iterations are enough here
        return estimator.fit(X, y)


def manual_mlp(estimator, X):
    h = X
    for k, (W, b) in enumerate(zip(estimator.coefs_, estimator.intercepts_)):
        h = h @ W + b
        if k < len(estimator.coefs_) - 1:
            h = np.maximum(h, 0)
    return h


def test_sklearn_multiclass_classifier_gives_logits(rng):
    from sklearn.neural_network import MLPClassifier

    X = rng.normal(size=(120, 5))
    y = (X[:, 0] > 0).astype(int) + (X[:, 1] > 0.5).astype(int)
    clf = fitted(MLPClassifier(hidden_layer_sizes=(8, 6), max_iter=300, random_state=0), X, y)
    network = load(clf)
    assert network.source == "sklearn MLPClassifier" and network.input_shape == (5,) and network.output_shape == (3,)
    logits = network.forward(X).numpy()
    np.testing.assert_allclose(logits, manual_mlp(clf, X), rtol=1e-12, atol=1e-12)
    log_proba = np.log(clf.predict_proba(X))
    np.testing.assert_allclose(logits - logits.mean(1, keepdims=True), log_proba - log_proba.mean(1, keepdims=True),
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(clf.classes_[logits.argmax(1)], clf.predict(X))


def test_sklearn_binary_classifier_gives_one_logit(rng):
    from sklearn.neural_network import MLPClassifier

    X = rng.normal(size=(100, 4))
    y = (X.sum(1) > 0).astype(int)
    clf = fitted(MLPClassifier(hidden_layer_sizes=(7,), max_iter=200, random_state=0), X, y)
    network = load(clf)
    assert network.output_shape == (1,)
    value = network.forward(X).numpy()[:, 0]
    np.testing.assert_allclose(value, manual_mlp(clf, X)[:, 0], rtol=1e-12, atol=1e-12)
    proba = np.clip(clf.predict_proba(X)[:, 1], 1e-12, 1 - 1e-12)
    np.testing.assert_allclose(expit(value), clf.predict_proba(X)[:, 1], rtol=1e-9, atol=1e-12)
    inside = (proba > 1e-6) & (proba < 1 - 1e-6)
    np.testing.assert_allclose(value[inside], logit(proba[inside]), rtol=1e-6, atol=1e-6)


def test_sklearn_regressor_matches_predict(rng):
    from sklearn.neural_network import MLPRegressor

    X = rng.normal(size=(80, 3))
    Y = np.stack([X[:, 0] - X[:, 1], np.abs(X[:, 2])], axis=1)
    reg = fitted(MLPRegressor(hidden_layer_sizes=(10,), max_iter=200, random_state=0), X, Y)
    network = load(reg)
    assert network.source == "sklearn MLPRegressor"
    np.testing.assert_allclose(network.forward(X).numpy(), reg.predict(X), rtol=1e-10, atol=1e-10)
    single = fitted(MLPRegressor(hidden_layer_sizes=(4,), max_iter=50, random_state=0), X, Y[:, 0])
    np.testing.assert_allclose(load(single).forward(X).numpy()[:, 0], single.predict(X), rtol=1e-10, atol=1e-10)


def test_sklearn_errors(rng):
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier

    X, y = rng.normal(size=(30, 2)), np.arange(30) % 2
    with pytest.raises(UnsupportedOperatorError, match="tanh"):
        load(fitted(MLPClassifier(hidden_layer_sizes=(3,), activation="tanh", max_iter=20), X, y))
    with pytest.raises(ModelLoadError, match="not fitted"):
        load(MLPClassifier())
    with pytest.raises(ModelLoadError, match="MLPClassifier and MLPRegressor"):
        load(fitted(LogisticRegression(), X, y))


# ---------------------------------------------------------------------- .nnet
NNET = """// A tiny network for tests
// Two comment lines, then the header
2,3,2,4,
3,4,2,
0,
-1.0,0.0,-2.0,
1.0,5.0,2.0,
0.5,2.0,-1.0,3.0,
2.0,4.0,0.5,10.0,
{weights0}
{biases0}
{weights1}
{biases1}
"""


def write_nnet(path, W0, b0, W1, b1):
    rows = lambda M: "\n".join(",".join(f"{v:.17g}" for v in row) + "," for row in M)  # noqa: E731
    path.write_text(NNET.format(weights0=rows(W0), biases0=rows(b0[:, None]), weights1=rows(W1),
                                biases1=rows(b1[:, None])))


def test_nnet_folds_normalisation_and_matches_numpy(tmp_path, rng):
    W0, b0, W1, b1 = rng.normal(size=(4, 3)), rng.normal(size=4), rng.normal(size=(2, 4)), rng.normal(size=2)
    path = tmp_path / "tiny.nnet"
    write_nnet(path, W0, b0, W1, b1)
    network = load(path)
    assert network.source == str(path) and network.input_shape == (3,) and network.output_shape == (2,)
    assert [type(layer) for layer in network.layers] == [Linear, ReLU, Linear]
    mins, maxes = nnet_input_bounds(path)
    np.testing.assert_array_equal(mins, [-1, 0, -2])
    np.testing.assert_array_equal(maxes, [1, 5, 2])
    x = rng.uniform(mins, maxes, size=(50, 3))
    means, ranges = np.array([0.5, 2.0, -1.0, 3.0]), np.array([2.0, 4.0, 0.5, 10.0])
    normalised = (x - means[:3]) / ranges[:3]
    expected = (np.maximum(normalised @ W0.T + b0, 0) @ W1.T + b1) * ranges[3] + means[3]
    np.testing.assert_allclose(network.forward(x).numpy(), expected, rtol=1e-12, atol=1e-12)


def test_nnet_errors(tmp_path, rng):
    W0, b0, W1, b1 = rng.normal(size=(4, 3)), rng.normal(size=4), rng.normal(size=(2, 4)), rng.normal(size=2)
    path = tmp_path / "truncated.nnet"
    write_nnet(path, W0, b0, W1, b1)
    path.write_text("\n".join(path.read_text().splitlines()[:-3]))
    with pytest.raises(ModelLoadError, match="truncated"):
        load(path)
    bad = tmp_path / "bad.nnet"
    write_nnet(bad, W0, b0, W1, b1)
    bad.write_text(bad.read_text().replace("3,4,2,", "3,4,2,7,"))
    with pytest.raises(ModelLoadError, match="line 4"):
        load(bad)
    with pytest.raises(ModelLoadError, match="takes 3 inputs"):
        write_nnet(path, W0, b0, W1, b1) or load(path, input_shape=(4,))
