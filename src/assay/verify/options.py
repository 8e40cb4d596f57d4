"""The verifier's options: one frozen value, defaults in one place, checked when built."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace

from assay._validate import check_choice, check_float, check_int
from assay.bounds.methods import METHODS
from assay.errors import OptionError
from assay.threads import SMALL_NETWORK_ELEMENTS, SMALL_NETWORK_PARAMETERS, one_thread_suffices

__all__ = ["VerifyOptions", "INPUT_SPLIT_MAX_INPUTS", "SMALL_NETWORK_PARAMETERS", "SMALL_NETWORK_ELEMENTS",
           "one_thread_suffices"]

# (SMALL_NETWORK_* and one_thread_suffices live in assay.threads; re-exported for callers.)

# Input splitting halves one input per step: beyond a handful of inputs ReLU splitting wins.
INPUT_SPLIT_MAX_INPUTS = 16

# Bound methods that input splitting can use: the registered ones that need no ReLU splits
# (ReLU splitting always uses β-CROWN).
# Input splitting shrinks boxes and scores splits by the rows' linear bounds: methods that give them.
INPUT_SPLIT_METHODS = tuple(name for name, method in METHODS.items() if not method.for_splits and method.linear)
# The branching strategies of verify (see VerifyOptions.strategy).
STRATEGIES = ("auto", "input", "relu", "operator")


@dataclass(frozen=True)
class VerifyOptions:
    """How :func:`assay.verify.verify` searches.

    Attributes:
        timeout: seconds (> 0); when exceeded the status is TIMEOUT. Every phase (bounding, the
            counterexample search, branching, leaf LPs) stops at the deadline, so the call
            returns soon after it (one bound pass or LP at most).
        method: bound method of input splitting: ``"alpha"`` (CROWN, then α-CROWN on the output
            rows of the boxes CROWN leaves open) or ``"crown"`` (input splitting needs the rows'
            linear bounds, which IBP does not give). ReLU splitting always uses β-CROWN.
        dtype: working dtype of the bounds (``"float64"``: verdicts should use it).
        batch_size: the most branches bounded per round (ReLU splitting: at most 256; input
            splitting on a network of small tensors: up to 8 times as many, see
            :func:`~assay.verify.input_split.input_round_size`).
        attack_restarts: PGD restarts of the counterexample search before branching (0: none).
        strategy: ``"input"`` (split the input box; best for few inputs, e.g. ACAS Xu),
            ``"relu"`` (split unstable ReLUs with β-CROWN; for many inputs), ``"operator"``
            (the general split: narrow the input of any non-linear operator — sigmoid, product,
            softmax, sign, ReLU — see :mod:`assay.verify.operator_split`) or ``"auto"``
            (input splitting when at most :data:`INPUT_SPLIT_MAX_INPUTS` inputs vary over the
            property's box, else ReLU splitting, or the general split on a network with other
            non-linear operators; inputs the property fixes to one value do not count, e.g. a
            1-D CNN over 800 sensor readings of which 4 are perturbed).
        keep_closed: also keep the closed branches in the result's ``searches`` (their boxes or
            split histories: memory grows with the search); pending branches are always kept.
        memory_limit: GiB that a search's pending branches may hold (> 0); past it the search
            stops with UNKNOWN instead of exhausting the machine (ReLU splitting keeps every
            pending domain's pre-activation bounds). None: 40 % of the machine's memory.
        threads: torch threads the search runs on (≥ 1), restored afterwards. None: one thread
            for a small network, whose tensors gain nothing from threads and lose much when
            the cores are shared, torch's setting otherwise (:func:`assay.threads.threads_for`).
    """

    timeout: float = 300.0
    method: str = "alpha"
    dtype: str = "float64"
    batch_size: int = 1024
    attack_restarts: int = 32
    strategy: str = "auto"
    keep_closed: bool = False
    memory_limit: float | None = None
    threads: int | None = None

    def __post_init__(self):
        check_float(self.timeout, "timeout", "verify", minimum=0.0, strict=True)
        check_choice(self.method, "method", "verify", INPUT_SPLIT_METHODS)
        if str(self.dtype) not in ("float64", "float32", "torch.float64", "torch.float32"):
            raise OptionError(f"the `dtype` option of verify must be 'float64' or 'float32'; got {self.dtype!r}")
        check_int(self.batch_size, "batch_size", "verify", minimum=1)
        check_int(self.attack_restarts, "attack_restarts", "verify", minimum=0)
        check_choice(self.strategy, "strategy", "verify", STRATEGIES)
        if self.memory_limit is not None:
            check_float(self.memory_limit, "memory_limit", "verify", minimum=0.0, strict=True)
        if self.threads is not None:
            check_int(self.threads, "threads", "verify", minimum=1)
        if not isinstance(self.keep_closed, bool):
            raise OptionError(f"the `keep_closed` option of verify must be True or False; got {self.keep_closed!r}")

    @classmethod
    def build(cls, options: VerifyOptions | None = None, **overrides) -> VerifyOptions:
        """``options`` (default: the defaults) with ``overrides`` applied; unknown names are an OptionError."""
        known = {f.name for f in fields(cls)}
        unknown = set(overrides) - known
        if unknown:
            raise OptionError(f"unknown verify option(s) {sorted(unknown)}; known: {sorted(known)}")
        if options is not None and not isinstance(options, VerifyOptions):
            raise OptionError(f"the `options` argument of verify must be a VerifyOptions; got {type(options).__name__}")
        return replace(options or cls(), **overrides)

    @property
    def memory_limit_bytes(self) -> int:
        """:attr:`memory_limit` in bytes (its default resolved on this machine)."""
        if self.memory_limit is not None:
            return int(self.memory_limit * 2**30)
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):  # not a POSIX system: assume 8 GiB
            total = 8 * 2**30
        return int(0.4 * total)

    def strategy_for(self, input_size: int, relu_splitting: bool = True) -> str:
        """The strategy used when ``input_size`` inputs vary over the box (resolves ``"auto"``).

        ``relu_splitting=False``: the network has non-linear operators other than ReLU, which
        ReLU splitting cannot branch on: ``"auto"`` picks the general split for many inputs, and
        an explicit ``"relu"`` is refused."""
        if self.strategy == "relu" and not relu_splitting:
            raise OptionError("strategy='relu' branches on ReLUs only; this network has other non-linear operators: "
                              "use strategy='operator', 'input' or 'auto'")
        if self.strategy != "auto":
            return self.strategy
        if input_size <= INPUT_SPLIT_MAX_INPUTS:
            return "input"
        return "relu" if relu_splitting else "operator"
