"""Options of the optimised bound methods, checked when built."""

from __future__ import annotations

from dataclasses import dataclass

from assay._validate import check_float, check_int

__all__ = ["AlphaCrownOptions", "BetaCrownOptions"]


@dataclass(frozen=True)
class AlphaCrownOptions:
    """α-CROWN (Xu et al., ICLR 2021): optimise the lower ReLU relaxation slopes with Adam.

    Attributes:
        iterations: Adam steps (α-CROWN's default 20).
        lr: learning rate of the slopes.
        lr_decay: multiplicative learning-rate decay per step.
    """

    iterations: int = 20
    lr: float = 0.1
    lr_decay: float = 0.98

    def __post_init__(self):
        check_int(self.iterations, "iterations", "alpha_crown", minimum=0)
        check_float(self.lr, "lr", "alpha_crown", minimum=0.0, strict=True)
        check_float(self.lr_decay, "lr_decay", "alpha_crown", minimum=0.0, strict=True)


@dataclass(frozen=True)
class BetaCrownOptions:
    """β-CROWN (Wang et al., NeurIPS 2021): α-CROWN plus optimised multipliers of split constraints.

    Attributes:
        iterations: Adam steps.
        lr_alpha, lr_beta: learning rates of slopes and split multipliers.
        lr_decay: multiplicative learning-rate decay per step.
    """

    iterations: int = 20
    lr_alpha: float = 0.1
    lr_beta: float = 0.05
    lr_decay: float = 0.98

    def __post_init__(self):
        check_int(self.iterations, "iterations", "beta_crown", minimum=0)
        check_float(self.lr_alpha, "lr_alpha", "beta_crown", minimum=0.0, strict=True)
        check_float(self.lr_beta, "lr_beta", "beta_crown", minimum=0.0, strict=True)
        check_float(self.lr_decay, "lr_decay", "beta_crown", minimum=0.0, strict=True)
