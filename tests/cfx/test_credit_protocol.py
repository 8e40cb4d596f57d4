"""The German credit pipeline against the published run (robust-ce-inn, expnns/credit.ipynb).

The expected rows are the notebook's printouts, checked by hand against the data files; the
expected δ, M2 shift and share of "sound" inputs are the values the notebook prints.
"""

import numpy as np
import pytest

from assay.cfx._credit import COLUMNS, ONE_HOT, ORDINAL, continuous_positions, load_credit, published_rows
from assay.errors import OptionError


def _encoded(codes: dict, duration: float, amount: float, age: float) -> np.ndarray:
    """The 72 variables of one applicant from its 0-based codes and scaled continuous values."""
    continuous = {"duration": duration, "amount": amount, "age": age}
    blocks = []
    for name in COLUMNS:
        if name in ORDINAL:
            blocks.append([1.0 if k <= codes[name] else 0.0 for k in range(ORDINAL[name])])
        elif name in ONE_HOT:
            blocks.append([1.0 if k == codes[name] else 0.0 for k in range(ONE_HOT[name])])
        else:
            blocks.append([continuous[name]])
    return np.concatenate(blocks)


def test_published_rows_pair_continuous_values_and_labels_with_the_next_rows_codes():
    X = np.arange(20, dtype=float).reshape(4, 5)  # continuous variables at 1 and 3
    y = np.array([1, 1, 0, 0])
    shifted, labels = published_rows(X, y, [1, 3])
    assert shifted.shape == (3, 5) and labels.tolist() == [1, 1, 0]
    for k in range(3):
        assert shifted[k, [1, 3]].tolist() == X[k, [1, 3]].tolist()
        assert shifted[k, [0, 2, 4]].tolist() == X[k + 1, [0, 2, 4]].tolist()
    assert X[0, 0] == 0.0  # the input is left as it was


def test_continuous_variables_sit_where_the_published_encoding_puts_them():
    # checking-status (4) precedes duration; credit-history (5) and purpose (11) precede amount; …
    assert continuous_positions() == [4, 21, 51]


def test_an_unknown_d2_form_is_refused_before_any_file_is_read(tmp_path):
    with pytest.raises(OptionError, match="d2_rows"):
        load_credit(tmp_path, d2_rows="shuffled")


@pytest.mark.data
def test_credit_rows_encode_as_the_published_notebook_printed_them(data_dir):
    folder = data_dir / "cfx" / "credit"
    X1, y1, X2, y2, features = load_credit(folder, d2_rows="published")
    assert X1.shape == (1000, 72) and X2.shape == (799, 72) and len(y2) == 799
    # D1, first line: A11,6,A34,A43,1169,A65,A75,4,A93,A101,4,A121,67,A143,A152,2,A173,1,A192,A201,1
    first = _encoded({"checking-status": 1, "credit-history": 1, "purpose": 4, "savings": 0, "employment": 4,
                      "rate": 3, "sex-status": 1, "guarantors": 0, "residence": 3, "property": 3, "installment": 2,
                      "housing": 2, "num-credits": 1, "job": 2, "liable": 0, "phone": 1, "foreign": 0},
                     (6 - 4) / 68, (1169 - 250) / 18174, (67 - 19) / 56)
    np.testing.assert_allclose(X1[0], first, atol=1e-12)
    # D1, last line (printed by the notebook: duration 0.602941, amount 0.238032, age 0.142857):
    # A12,45,A34,A41,4576,A62,A71,3,A93,A101,4,A123,27,A143,A152,1,A173,1,A191,A201,1
    last = _encoded({"checking-status": 2, "credit-history": 1, "purpose": 2, "savings": 2, "employment": 0,
                     "rate": 2, "sex-status": 1, "guarantors": 0, "residence": 3, "property": 1, "installment": 2,
                     "housing": 2, "num-credits": 0, "job": 2, "liable": 0, "phone": 0, "foreign": 0},
                    0.602941, 0.238032, 0.142857)
    np.testing.assert_allclose(X1[-1], last, atol=1e-6)
    assert y1[0] == 1 and y1[1] == 0 and y1[-1] == 1
    # D2 as the published runs trained on it (the notebook's rows 1 and 799): the continuous values of
    # file records Id 0 (18, 1049, 21) and Id 998 (12, 6468, 52), the codes of Id 1 and Id 999
    row_first = _encoded({"checking-status": 0, "credit-history": 4, "purpose": 0, "savings": 0, "employment": 2,
                          "rate": 1, "sex-status": 2, "guarantors": 0, "residence": 1, "property": 0,
                          "installment": 2, "housing": 0, "num-credits": 1, "job": 2, "liable": 0, "phone": 0,
                          "foreign": 1}, 0.205882, 0.043964, 0.035714)
    row_last = _encoded({"checking-status": 0, "credit-history": 2, "purpose": 2, "savings": 4, "employment": 4,
                         "rate": 3, "sex-status": 2, "guarantors": 0, "residence": 3, "property": 1,
                         "installment": 2, "housing": 1, "num-credits": 0, "job": 2, "liable": 1, "phone": 0,
                         "foreign": 1}, 0.117647, 0.342137, 0.589286)
    np.testing.assert_allclose(X2[0], row_first, atol=1e-6)
    np.testing.assert_allclose(X2[-1], row_last, atol=1e-6)
    # the file is sorted by label (600 good, then 200 bad): the labels follow the continuous values' rows
    assert y2[:600].tolist() == [1] * 600 and y2[600:].tolist() == [0] * 199
    assert all(features.violations(row) == [] for row in X2)
    # the published counterfactual cost: a continuous value 1, a purpose bit 1/2 (11 categories), a savings bit 1/4
    assert features.cost[continuous_positions()].tolist() == [1.0, 1.0, 1.0]
    assert features.cost[10] == 0.5 and features.cost[22] == 0.25
    # the file's own rows: record Id 0 whole
    _, _, X2_file, y2_file, _ = load_credit(folder, d2_rows="file")
    assert X2_file.shape == (800, 72) and y2_file[0] == 1
    record = _encoded({"checking-status": 0, "credit-history": 4, "purpose": 2, "savings": 0, "employment": 1,
                       "rate": 3, "sex-status": 1, "guarantors": 0, "residence": 3, "property": 1, "installment": 2,
                       "housing": 0, "num-credits": 0, "job": 2, "liable": 1, "phone": 0, "foreign": 1},
                      (18 - 4) / 68, (1049 - 250) / 18174, (21 - 19) / 56)
    np.testing.assert_allclose(X2_file[0], record, atol=1e-12)


@pytest.mark.data
def test_credit_protocol_reproduces_the_published_run(data_dir):
    """The notebook prints δ = 0.054449288758308775 (5 retrainings on 4 % of D2), the M2 shift
    1.5372448287620384 (the most shifted of 5 retrainings on 99 % of D2) and 87 sound inputs among
    the 284 rejected rows drawn (0.30633802816901406): all three come out here."""
    from assay.cfx.data import flat_parameters, load_dataset, model_shifts, test_inputs, train_model

    dataset = load_dataset("credit", data_dir, d2_rows="published")
    model = train_model(dataset)
    delta, retrained, m2 = model_shifts(dataset, model)
    assert delta == pytest.approx(0.054449288758308775, abs=1e-12)
    assert len(retrained) == 5
    assert float(np.abs(flat_parameters(m2) - flat_parameters(model)).max()) == pytest.approx(1.5372448287620384,
                                                                                             abs=1e-12)
    assert (model.predict(dataset.X1) == 0).sum() == 284
    sound = test_inputs(dataset, model, count=2000, sound_delta=delta)
    assert len(sound) == 87
