"""The general-networks section of ``assay demo``: its figures are consistent and its verdicts right."""

from __future__ import annotations

import torch

from assay.verify.general_demo import control_policy, demo_section


def test_the_general_demo_bounds_contain_the_samples_and_its_verdicts_match_them():
    data = demo_section()
    assert {"Sin", "Cos", "Tanh", "Sigmoid", "Mul"} <= set(data["operators"])
    sampled = data["sampled"]
    for method, bounds in data["bounds"].items():
        assert bounds["lower"] <= sampled["min"] and bounds["upper"] >= sampled["max"], method
    # tighter methods are tighter here: CROWN within IBP's interval, α-CROWN within CROWN's
    assert data["bounds"]["crown"]["upper"] <= data["bounds"]["ibp"]["upper"]
    assert data["bounds"]["alpha"]["upper"] <= data["bounds"]["crown"]["upper"]
    above, below = data["verdicts"]
    assert above["threshold"] > sampled["max"] > below["threshold"]
    assert above["status"] == "holds" and below["status"] == "violated"
    point = torch.tensor(below["counterexample"]["input"], dtype=torch.float64).reshape(1, 2)
    assert float(control_policy().forward(point)) >= below["threshold"]
