"""Options of the optimised bound methods, checked when built."""

from __future__ import annotations

from dataclasses import dataclass

from assay._validate import check_choice, check_float, check_int

__all__ = ["AlphaCrownOptions", "BetaCrownOptions"]


@dataclass(frozen=True)
class AlphaCrownOptions:
    """α-CROWN (Xu et al., ICLR 2021): optimise the lower ReLU relaxation slopes with Adam.

    Attributes:
        iterations: Adam steps (α-CROWN's default 20).
        lr: learning rate of the slopes.
        lr_decay: multiplicative learning-rate decay per step.
        draft_dtype: ``"float32"`` to take the Adam steps in float32 when bounding in float64:
            the returned bounds are still the float64 bounds (rounding charged) of the starting
            slopes and of each domain's best float32 iterate (see ``optimize_bounds``); None
            (default): every step in the call's dtype.
    """

    iterations: int = 20
    lr: float = 0.1
    lr_decay: float = 0.98
    draft_dtype: str | None = None

    def __post_init__(self):
        check_int(self.iterations, "iterations", "alpha_crown", minimum=0)
        check_float(self.lr, "lr", "alpha_crown", minimum=0.0, strict=True)
        check_float(self.lr_decay, "lr_decay", "alpha_crown", minimum=0.0, strict=True)
        if self.draft_dtype is not None:
            check_choice(self.draft_dtype, "draft_dtype", "alpha_crown", ("float32", "float64"))


@dataclass(frozen=True)
class BetaCrownOptions:
    """β-CROWN (Wang et al., NeurIPS 2021): α-CROWN plus optimised multipliers of split constraints.

    Attributes:
        iterations: Adam steps.
        lr_alpha, lr_beta: learning rates of slopes and split multipliers.
        lr_decay: multiplicative learning-rate decay per step.
        draft_dtype: as for :class:`AlphaCrownOptions`: float32 steps, float64 bounds.
    """

    iterations: int = 20
    lr_alpha: float = 0.1
    lr_beta: float = 0.05
    lr_decay: float = 0.98
    draft_dtype: str | None = None

    def __post_init__(self):
        check_int(self.iterations, "iterations", "beta_crown", minimum=0)
        check_float(self.lr_alpha, "lr_alpha", "beta_crown", minimum=0.0, strict=True)
        check_float(self.lr_beta, "lr_beta", "beta_crown", minimum=0.0, strict=True)
        check_float(self.lr_decay, "lr_decay", "beta_crown", minimum=0.0, strict=True)
        if self.draft_dtype is not None:
            check_choice(self.draft_dtype, "draft_dtype", "beta_crown", ("float32", "float64"))

