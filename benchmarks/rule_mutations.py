"""Do the bound rules' tests catch a bound moved inward by 1e-4? One planted bug at a time.

For every rule family of :mod:`assay.bounds.rules` (and the ReLU network's own stages) this holds
a list of *mutations*: ``(file, exact source snippet, replacement)``, each of which moves one
bound inward by 1e-4 — the interval (its lower end raised or its upper end lowered), the linear
relaxation (the lower line's intercept raised or the upper line's lowered), the path that
α-CROWN's optimisable parameters take (a shift only where ``alpha`` is given) and, where the
family has one of its own, its crossing in the forward linear bounds
(:mod:`assay.bounds.forward`). Each mutated bound is unsound, so some test ought to fail.

The script copies ``src/`` to a temporary folder, applies ONE mutation there, runs pytest on the
family's test files with ``PYTHONPATH`` pointing at the copy (``-x -q -p no:cacheprovider -n 1``),
records whether a test failed (which one first, and the seconds) and restores the file. An
unmutated baseline over every file named runs first and must pass. A snippet that is not found
exactly once in the current source, a replacement that does not compile, or a run that errors
(rather than fails a test) stops the script with a non-zero status, so that it does not rot
silently when the code changes: update the snippet. A mutation no test catches is a finding
(exit status 1): a test is missing.

Writes ``benchmarks/results/<name>.json`` and ``.md``.

    .venv/bin/python benchmarks/rule_mutations.py [--only TEXT] [--list] [--name rule_mutations]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO_ROOT, markdown_table, write_results  # noqa: E402

SHIFT = "1e-4"
RULES = "assay/bounds/rules/"
STAGES = "assay/bounds/stages/"

# Every family's run also takes these: the forward linear bounds and whole networks of general
# operators sampled against their bounds (a few seconds each).
COMMON = ("tests/bounds/rules/test_forward_crossings.py", "tests/bounds/test_forward_general.py", "tests/bounds/test_general_graphs.py",
          "tests/bounds/test_forward_constants.py", "tests/bounds/test_forward_fixed_inputs.py")

FAMILY_TESTS = {
    "s_shaped": ("tests/bounds/rules/test_s_shaped.py",),
    "convex": ("tests/bounds/rules/test_convex.py",),
    "curvature": ("tests/bounds/rules/test_curvature.py", "tests/bounds/rules/test_s_shaped.py",
                  "tests/bounds/rules/test_convex.py"),
    "trigonometric": ("tests/bounds/rules/test_trigonometric.py",),
    "piecewise": ("tests/bounds/rules/test_piecewise.py",),
    "steps": ("tests/bounds/rules/test_steps.py", "tests/bounds/rules/test_decisions.py"),  # Cast's tests
    "minmax": ("tests/bounds/rules/test_minmax.py",),
    "bilinear": ("tests/bounds/rules/test_bilinear.py", "tests/bounds/test_forward_products.py"),
    "multi": ("tests/bounds/rules/test_bilinear.py", "tests/bounds/rules/test_minmax.py"),
    "quadratic": ("tests/bounds/rules/test_quadratic.py", "tests/bounds/rules/test_linearized.py"),
    "linearized": ("tests/bounds/rules/test_linearized.py", "tests/bounds/rules/test_quadratic.py"),
    "softmax": ("tests/bounds/rules/test_softmax.py", "tests/bounds/test_attention_alpha.py"),
    "decisions": ("tests/bounds/rules/test_decisions.py",),
    "linear": ("tests/bounds/rules/test_linear.py",),
    "relu_network": ("tests/bounds/rules/test_relu_lines.py", "tests/bounds/test_soundness.py", "tests/bounds/test_maxpool.py",
                     "tests/bounds/test_forward_symbols.py", "tests/bounds/test_relu_coefficients.py",
                     "tests/bounds/test_alpha_branches.py"),
}


@dataclass(frozen=True)
class Mutation:
    family: str
    kind: str  # interval | relaxation | alpha | forward
    name: str
    file: str  # relative to src/
    snippet: str
    replacement: str


def shifted(expression: str, field: str, when: str = "") -> str:
    """``expression`` (a Relaxation) with ``field`` moved inward by SHIFT (raised for a lower
    intercept, lowered for an upper one); only where ``when`` holds, if given."""
    op = "+" if field.startswith("lower") else "-"
    amount = SHIFT if not when else f"({SHIFT} if {when} else 0.0)"
    return f"(lambda _r: __import__('dataclasses').replace(_r, {field}=_r.{field} {op} {amount}))({expression})"


def ends(expression: str, lower: bool) -> str:
    """An ``(lo, hi)`` pair with ``lo`` raised (or ``hi`` lowered) by SHIFT."""
    change = f"(lo + {SHIFT}, hi)" if lower else f"(lo, hi - {SHIFT})"
    return f"(lambda lo, hi: {change})(*{expression})"


# forward linear bounds of an element-wise operator: its rule's relaxation, shifted for one family
_FORWARD_SNIPPET = "    relaxation = stage.rule.relax(stage.layer, lower, upper)\n"


def forward_elementwise(family: str, module: str, field: str) -> Mutation:
    test = f"type(stage.rule).__module__ == 'assay.bounds.rules.{module}'"
    return Mutation(family, "forward", f"forward element-wise crossing: {field} moved inward", STAGES + "operator.py",
                    _FORWARD_SNIPPET,
                    f"    relaxation = {shifted('stage.rule.relax(stage.layer, lower, upper)', field, test)}\n")


def _s_shaped() -> list[Mutation]:
    f, relax = RULES + "s_shaped.py", "relax_s_curve(self.curve, 0.0, lower, upper, alpha, self.interval(layer, lower, upper))"
    return [
        Mutation("s_shaped", "interval", "Sigmoid/Tanh interval: lower end raised", f,
                 "return lo.clamp(min=self.floor), hi.clamp(max=self.ceiling)",
                 f"return lo.clamp(min=self.floor) + {SHIFT}, hi.clamp(max=self.ceiling)"),
        Mutation("s_shaped", "relaxation", "Sigmoid/Tanh upper line lowered", f, f"return {relax}",
                 f"return {shifted(relax, 'upper_intercept')}"),
        Mutation("s_shaped", "alpha", "Sigmoid/Tanh lower line raised where alpha is given", f, f"return {relax}",
                 f"return {shifted(relax, 'lower_intercept', 'alpha is not None')}"),
        forward_elementwise("s_shaped", "s_shaped", "lower_intercept"),
    ]


def _convex() -> list[Mutation]:
    f = RULES + "convex.py"
    exp = ("relax_s_curve(EXP, math.inf, lower, upper, (torch.minimum(a_low, cap), a_up),\n"
           "                             self.interval(layer, lower, upper))")
    log_interval = "monotone_interval(torch.log, low, up)"
    return [
        Mutation("convex", "interval", "Exp interval: upper end lowered", f, "return lo.clamp(min=0.0), hi\n",
                 f"return lo.clamp(min=0.0), hi - {SHIFT}\n"),
        Mutation("convex", "relaxation", "Exp lower line (tangent) raised", f, f"return {exp}",
                 f"return {shifted(exp, 'lower_intercept')}"),
        Mutation("convex", "alpha", "Exp tangent raised where alpha is given", f, f"return {exp}",
                 f"return {shifted(exp, 'lower_intercept', 'alpha is not None')}"),
        Mutation("convex", "interval", "Log interval: lower end raised", f, f"*{log_interval})",
                 f"*{ends(log_interval, True)})"),
        Mutation("convex", "relaxation", "Log upper line (tangent) lowered", f,
                 "return constant_where(outside, relaxation)",
                 f"return {shifted('constant_where(outside, relaxation)', 'upper_intercept')}"),
        Mutation("convex", "interval", "Pow/Reciprocal/Sqrt interval: lower end raised", f,
                 "return _both_unbounded(outside, lo, hi)", f"return _both_unbounded(outside, lo + {SHIFT}, hi)"),
        Mutation("convex", "relaxation", "Pow/Reciprocal/Sqrt lower line raised", f,
                 "return constant_where(pole, relaxation, interval[0], math.inf)",
                 f"return {shifted('constant_where(pole, relaxation, interval[0], math.inf)', 'lower_intercept')}"),
        forward_elementwise("convex", "convex", "upper_intercept"),
    ]


def _curvature() -> list[Mutation]:
    f = RULES + "curvature.py"
    return [
        Mutation("curvature", "interval", "monotone_interval: upper end lowered", f, "return widen(lo, hi, ulps)",
                 f"return widen(lo, hi - {SHIFT}, ulps)"),
        Mutation("curvature", "relaxation", "clear_point: intercept lowered", f,
                 "return torch.where(_finite(fz, sz, intercept), intercept,",
                 f"return torch.where(_finite(fz, sz, intercept), intercept - {SHIFT},"),
        Mutation("curvature", "relaxation", "clear_concave: intercept lowered", f,
                 "return torch.where(_finite(ft, dt, st, left, right, intercept), intercept,",
                 f"return torch.where(_finite(ft, dt, st, left, right, intercept), intercept - {SHIFT},"),
        Mutation("curvature", "relaxation", "lower_line: intercept raised", f, "return slope, -intercept\n",
                 f"return slope, -intercept + {SHIFT}\n"),
    ]


def _trigonometric() -> list[Mutation]:
    f = RULES + "trigonometric.py"
    interval = "cast_outward(*self._range64(l, u, wide), lower.dtype)"
    cast = "        lower_icpt, upper_icpt = cast_outward(lower_icpt, upper_icpt, dtype)\n        # wide"
    return [
        Mutation("trigonometric", "interval", "Sin/Cos interval: lower end raised", f, f"return {interval}",
                 f"return {ends(interval, True)}"),
        Mutation("trigonometric", "relaxation", "Sin/Cos upper line lowered", f, cast,
                 cast.replace("\n        # wide", f"\n        upper_icpt = upper_icpt - {SHIFT}\n        # wide")),
        Mutation("trigonometric", "alpha", "Sin/Cos lower line raised where alpha is given", f, cast,
                 cast.replace("\n        # wide", f"\n        if a_low is not None:\n"
                              f"            lower_icpt = lower_icpt + {SHIFT}\n        # wide")),
        forward_elementwise("trigonometric", "trigonometric", "lower_intercept"),
    ]


def _piecewise() -> list[Mutation]:
    f = RULES + "piecewise.py"
    cast = "        lower_icpt, upper_icpt = cast_outward(lower_icpt, upper_icpt, dtype)\n        zero ="
    return [
        Mutation("piecewise", "interval", "Abs/LeakyRelu/Clip/Sign interval: upper end lowered", f,
                 "return cast_outward(low, high, lower.dtype)", f"return cast_outward(low, high - {SHIFT}, lower.dtype)"),
        Mutation("piecewise", "relaxation", "Abs/LeakyRelu/Clip/Sign lower line raised", f, cast,
                 cast.replace("\n        zero =", f"\n        lower_icpt = lower_icpt + {SHIFT}\n        zero =")),
        Mutation("piecewise", "alpha", "Abs/LeakyRelu/Clip/Sign upper line lowered where alpha is given", f, cast,
                 cast.replace("\n        zero =", f"\n        if alpha_upper is not None:\n"
                              f"            upper_icpt = upper_icpt - {SHIFT}\n        zero =")),
        forward_elementwise("piecewise", "piecewise", "upper_intercept"),
    ]


def _steps() -> list[Mutation]:
    f = RULES + "steps.py"
    floor = ("lower_icpt, upper_icpt = cast_outward(torch.where(one_cell, cell, bottom), "
             "torch.where(one_cell, cell, top), dtype)")
    return [
        Mutation("steps", "interval", "Floor interval: upper end lowered", f,
                 "return torch.floor(lower), torch.floor(upper)", f"return torch.floor(lower), torch.floor(upper) - {SHIFT}"),
        Mutation("steps", "relaxation", "Floor lower line raised (across an integer)", f, floor,
                 floor.replace("cell, bottom)", f"cell, bottom + {SHIFT})")),
        Mutation("steps", "alpha", "Floor upper line lowered where alpha is given", f, floor,
                 floor.replace("cell, top)", f"cell, top - ({SHIFT} if alpha_upper is not None else 0.0))")),
        Mutation("steps", "interval", "Cast interval: lower end raised", f,
                 "return layer.forward(lower), layer.forward(upper)",
                 f"return layer.forward(lower) + {SHIFT}, layer.forward(upper)"),
        Mutation("steps", "relaxation", "Cast to a narrower float: lower line raised", f,
                 "torch.where(fits, -step, lo)", f"torch.where(fits, -step + {SHIFT}, lo)"),
        Mutation("steps", "relaxation", "Cast to an integer/bool: upper line lowered", f,
                 "return Relaxation(zero, lo, zero, hi)", f"return Relaxation(zero, lo, zero, hi - {SHIFT})"),
        forward_elementwise("steps", "steps", "lower_intercept"),
    ]


def _minmax() -> list[Mutation]:
    f = RULES + "minmax.py"
    offset = "offset = offset_terms.reshape(batch, n_rows, -1).sum(-1)"
    lifted = "positive.reshape(batch, n_rows, -1).sum(-1)"
    return [
        Mutation("minmax", "interval", "Min/Max interval: lower end raised", f, "lo, hi = L.amax(1), U.amax(1)",
                 f"lo, hi = L.amax(1) + {SHIFT}, U.amax(1)"),
        Mutation("minmax", "relaxation", "Min/Max lower line raised", f, offset, f"{offset} + {SHIFT} * {lifted}"),
        Mutation("minmax", "relaxation", "Min/Max upper plane lowered", f,
                 "negative * c.unsqueeze(1), torch.zeros_like(negative)",
                 f"negative * (c.unsqueeze(1) - {SHIFT}), torch.zeros_like(negative)"),
        Mutation("minmax", "alpha", "Min/Max lower line raised where alpha is given", f, offset,
                 f"{offset} + ({SHIFT} if alpha is not None else 0.0) * {lifted}"),
    ]


def _bilinear() -> list[Mutation]:
    f = RULES + "bilinear.py"
    mul = ("offset = -terms.reshape(A.shape[0], A.shape[1], -1).sum(-1)\n    with torch.no_grad():\n"
           "        outputs = A[0, 0].numel()")
    matmul = ("offset = -terms.reshape(A.shape[0], A.shape[1], -1).sum(-1)\n        with torch.no_grad():\n"
              "            outputs, inner")
    positive = "A.clamp(min=0).reshape(A.shape[0], A.shape[1], -1).sum(-1)"
    negative = "A.clamp(max=0).reshape(A.shape[0], A.shape[1], -1).sum(-1)"
    first_line = "offset = -terms.reshape(A.shape[0], A.shape[1], -1).sum(-1)"
    return [
        Mutation("bilinear", "interval", "Mul interval: lower end raised", f,
                 "    return interval_sum(lo, hi, None)", f"    return interval_sum(lo + {SHIFT}, hi, None)"),
        Mutation("bilinear", "relaxation", "Mul McCormick lower planes raised", f, mul,
                 mul.replace(first_line, f"{first_line} + {SHIFT} * {positive}")),
        Mutation("bilinear", "alpha", "Mul McCormick lower planes raised where alpha is given", f, mul,
                 mul.replace(first_line, f"{first_line} + ({SHIFT} if alpha is not None else 0.0) * {positive}")),
        Mutation("bilinear", "interval", "MatMul interval: upper end lowered", f, "return interval_sum(lo, hi, -2)",
                 f"return {ends('interval_sum(lo, hi, -2)', False)}"),
        Mutation("bilinear", "relaxation", "MatMul McCormick upper planes lowered", f, matmul,
                 matmul.replace(first_line, f"{first_line} - {SHIFT} * {negative}")),
        Mutation("bilinear", "interval", "Div interval: lower end raised", f,
                 "torch.where(zero_out, torch.full_like(lo, -math.inf), lo),",
                 f"torch.where(zero_out, torch.full_like(lo, -math.inf), lo + {SHIFT}),"),
        Mutation("bilinear", "relaxation", "Div crossing's offset raised", f, "total = offset + crossed.offset\n",
                 f"total = offset + crossed.offset + {SHIFT}\n"),
        Mutation("bilinear", "alpha", "Div offset raised where alpha (planes, tangent of 1/b) is given", f,
                 "total = offset + crossed.offset\n",
                 f"total = offset + crossed.offset + ({SHIFT} if alpha is not None else 0.0)\n"),
        Mutation("bilinear", "forward", "forward product by a fixed factor: lower function raised",
                 "assay/bounds/forward_products.py", "return type(f)(*side(low, high), *side(high, low))",
                 f"return type(f)(*(lambda s: (s[0], s[1] + {SHIFT}, s[2]))(side(low, high)), *side(high, low))"),
    ]


def _multi() -> list[Mutation]:
    f = RULES + "multi.py"
    return [
        Mutation("multi", "interval", "product_corners: smallest corner raised", f,
                 "return corners.amin(0), corners.amax(0)", f"return corners.amin(0) + {SHIFT}, corners.amax(0)"),
        Mutation("multi", "interval", "interval_sum: upper end lowered", f,
                 "high = high + g * total(hi.abs()) + n * underflow(dtype) * 4",
                 f"high = high + g * total(hi.abs()) + n * underflow(dtype) * 4 - {SHIFT}"),
    ]


def _quadratic() -> list[Mutation]:
    f = RULES + "quadratic.py"
    return [
        Mutation("quadratic", "relaxation", "tangent_plane: offset raised", f,
                 "return 2 * Qp, -(p * Qp).sum(-1), owed, convex",
                 f"return 2 * Qp, -(p * Qp).sum(-1) + {SHIFT}, owed, convex"),
        Mutation("quadratic", "relaxation", "tangent_crossing: chosen rows' offset raised", f,
                 "offset = torch.where(chosen, o_full, offset)", f"offset = torch.where(chosen, o_full + {SHIFT}, offset)"),
    ]


def _linearized() -> list[Mutation]:
    f = RULES + "linearized.py"
    return [
        Mutation("linearized", "relaxation", "linearized crossing: chosen rows' offset raised", f,
                 "torch.where(chosen, full_o, offset)", f"torch.where(chosen, full_o + {SHIFT}, offset)"),
        Mutation("linearized", "relaxation", "remainder's McCormick planes: offset raised", f,
                 "offset = -(R * alpha * beta).sum((-1, -2))", f"offset = -(R * alpha * beta).sum((-1, -2)) + {SHIFT}"),
    ]


def _softmax() -> list[Mutation]:
    f = RULES + "softmax.py"
    return [
        Mutation("softmax", "interval", "Softmax interval: lower end raised", f,
                 "return lo.movedim(-1, dim), hi.movedim(-1, dim)",
                 f"return (lo + {SHIFT}).movedim(-1, dim), hi.movedim(-1, dim)"),
        Mutation("softmax", "relaxation", "Softmax constant (interval) bound raised", f,
                 "constant = _dot_below(positive, negative, lo, hi)  #",
                 f"constant = _dot_below(positive, negative, lo, hi) + {SHIFT}  #"),
        Mutation("softmax", "relaxation", "Softmax mean-value linearisation raised", f,
                 "linear = at_c - moved - remainder\n", f"linear = at_c - moved - remainder + {SHIFT}\n"),
        Mutation("softmax", "relaxation", "Softmax sub-box offsets raised", f,
                 "offset = at_c - moved - remainder\n", f"offset = at_c - moved - remainder + {SHIFT}\n"),
        Mutation("softmax", "alpha", "Softmax linearisation raised where alpha is given", f,
                 "linear = at_c - moved - remainder\n",
                 f"linear = at_c - moved - remainder + ({SHIFT} if alpha is not None else 0.0)\n"),
    ]


def _decisions() -> list[Mutation]:
    f = RULES + "decisions.py"
    return [
        Mutation("decisions", "interval", "ArgMax interval: lower end raised", f,
                 "return lo.clamp(0.0, last).nan_to_num(0.0, 0.0, 0.0),",
                 f"return lo.clamp(0.0, last).nan_to_num(0.0, 0.0, 0.0) + {SHIFT},"),
        Mutation("decisions", "interval", "Equal interval: upper end lowered", f,
                 "return lo.contiguous(), hi.contiguous()", f"return lo.contiguous(), hi.contiguous() - {SHIFT}"),
        Mutation("decisions", "interval", "IndexTable interval: lower end raised", f,
                 "return cast_outward(lo, hi, dtype)", f"return cast_outward(lo + {SHIFT}, hi, dtype)"),
        Mutation("decisions", "relaxation", "constant lines: offset raised", f,
                 "offset = terms.reshape(batch, rows, -1).sum(-1)\n",
                 f"offset = terms.reshape(batch, rows, -1).sum(-1) + {SHIFT}\n"),
    ]


def _linear() -> list[Mutation]:
    f = RULES + "linear.py"
    return [
        Mutation("linear", "interval", "affine operator interval: lower end raised", f,
                 "return out_center - out_radius - margin, out_center + out_radius + margin",
                 f"return out_center - out_radius - margin + {SHIFT}, out_center + out_radius + margin"),
        Mutation("linear", "interval", "moving operator (slice, concat, …) interval: upper end lowered", f,
                 "low, high = layer.forward(*lowers), layer.forward(*uppers)",
                 f"low, high = layer.forward(*lowers), layer.forward(*uppers) - {SHIFT}"),
        Mutation("linear", "interval", "moving operator: a constant float32 cannot hold left rounded to nearest", f,
                 "moved = error > 0", "moved = error < 0"),
        Mutation("linear", "relaxation", "affine operator crossing: offset raised", f,
                 "offset = dot(A, constant) if bool((constant != 0).any()) else A.new_zeros(batch, rows)",
                 f"offset = (dot(A, constant) if bool((constant != 0).any()) else A.new_zeros(batch, rows)) + {SHIFT}"),
        Mutation("linear", "forward", "forward affine operator: both functions moved inward", STAGES + "operator.py",
                 "c_half = absolute(*[(f.c_hi - f.c_lo) / 2 for f in sources])",
                 f"c_half = absolute(*[(f.c_hi - f.c_lo) / 2 for f in sources]) - {SHIFT}"),
        Mutation("linear", "forward", "forward moving operator: lower function raised", STAGES + "operator.py",
                 "a_lo, layer.forward(*[f.c_lo for f in sources]),",
                 f"a_lo, layer.forward(*[f.c_lo for f in sources]) + {SHIFT},"),
    ]


def _relu_network() -> list[Mutation]:
    relu, slopes = STAGES + "relu.py", "walk.slopes[position], lower_slope)\n"
    return [
        Mutation("relu_network", "interval", "ReLU interval: upper end lowered", relu,
                 "return tuple(t.clamp(min=0) for t in bounds[self.sources[0]])",
                 f"return tuple(t.clamp(min=0) - d for t, d in zip(bounds[self.sources[0]], (0.0, {SHIFT})))"),
        Mutation("relu_network", "relaxation", "ReLU upper line (chord) lowered", "assay/bounds/relaxation.py",
                 "intercept = torch.where(unstable, intercept + nudge, intercept)",
                 f"intercept = torch.where(unstable, intercept + nudge - {SHIFT}, intercept)"),
        Mutation("relu_network", "alpha", "ReLU lower line raised where α-CROWN's slopes are used", relu, slopes,
                 slopes + f"        walk.b = walk.b + {SHIFT} * (A.clamp(min=0) * relaxation.unstable.unsqueeze(1))"
                 ".flatten(2).sum(-1)\n"),
        Mutation("relu_network", "forward", "forward ReLU: upper function lowered (unstable neurons)", relu,
                 "c_hi = f.c_hi * slope + intercept\n", f"c_hi = f.c_hi * slope + intercept - {SHIFT} * relax.unstable\n"),
        Mutation("relu_network", "forward", "forward ReLU symbols: error range shrunk", relu,
                 "gap = torch.maximum(-slope * lower, (1 - slope) * upper) * (1 + 4 * u)",
                 f"gap = torch.maximum(-slope * lower, (1 - slope) * upper) * (1 + 4 * u) - {SHIFT}"),
        Mutation("relu_network", "interval", "MaxPool interval: upper end lowered", STAGES + "maxpool.py",
                 "return tuple(F.max_pool2d(t, self.kernel, self.stride) for t in bounds[self.sources[0]])",
                 "return tuple(F.max_pool2d(t, self.kernel, self.stride) - d for t, d in "
                 f"zip(bounds[self.sources[0]], (0.0, {SHIFT})))"),
        Mutation("relu_network", "relaxation", "MaxPool upper constant lowered", STAGES + "maxpool.py",
                 "A * relaxation.upper.unsqueeze(1))", f"A * (relaxation.upper.unsqueeze(1) - {SHIFT}))"),
        Mutation("relu_network", "interval", "Linear/Conv interval: lower end raised", STAGES + "affine.py",
                 "return out_lower - margin, out_upper + margin", f"return out_lower - margin + {SHIFT}, out_upper + margin"),
        Mutation("relu_network", "relaxation", "Linear/Conv crossing: bias term raised", STAGES + "affine.py",
                 "walk.b = walk.b + stage.bias_term(A, dtype=torch.float64)",
                 f"walk.b = walk.b + stage.bias_term(A, dtype=torch.float64) + {SHIFT}"),
    ]


def mutations() -> list[Mutation]:
    return [*_s_shaped(), *_convex(), *_curvature(), *_trigonometric(), *_piecewise(), *_steps(), *_minmax(),
            *_bilinear(), *_multi(), *_quadratic(), *_linearized(), *_softmax(), *_decisions(), *_linear(),
            *_relu_network()]


def check(mutation: Mutation, source: Path) -> str:
    """The mutated text of the mutation's file; exits if the snippet is not there exactly once or
    the result does not compile."""
    path = source / mutation.file
    text = path.read_text()
    count = text.count(mutation.snippet)
    if count != 1:
        raise SystemExit(f"mutation {mutation.family}/{mutation.name!r}: its snippet occurs {count} times in "
                         f"src/{mutation.file} (must be exactly once): update benchmarks/rule_mutations.py\n"
                         f"snippet: {mutation.snippet!r}")
    mutated = text.replace(mutation.snippet, mutation.replacement)
    try:
        compile(mutated, str(path), "exec")
    except SyntaxError as exc:
        raise SystemExit(f"mutation {mutation.family}/{mutation.name!r} does not compile: {exc}") from exc
    return mutated


def run_tests(copy: Path, tests: list[str], timeout: float) -> dict:
    """pytest on ``tests`` with the copy's source first on the path: status (passed, caught,
    error), the first failing test, seconds."""
    env = dict(os.environ, PYTHONPATH=str(copy))
    # one seed for Hypothesis's examples, and a fresh working folder for its database: no run
    # replays the failing examples another mutation left behind
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-n", "1", "--hypothesis-seed=0",
               *(str(REPO_ROOT / t) for t in tests)]
    started = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="assay-mutation-run-") as cwd:
            done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "error", "first_failure": f"timed out after {timeout:.0f} s",
                "seconds": round(time.perf_counter() - started, 1)}
    seconds = round(time.perf_counter() - started, 1)
    output = done.stdout + done.stderr
    # node ids from the run's own folder: keep them from "tests/" on
    failed = [name[name.find("tests/"):] for name in re.findall(r"^FAILED (\S+)", output, re.MULTILINE)]
    if done.returncode == 0:
        return {"status": "passed", "first_failure": "", "seconds": seconds}
    if failed:  # (under xdist, -x ends the run as "interrupted": status 2)
        return {"status": "caught", "first_failure": failed[0], "seconds": seconds}
    errors = re.findall(r"^ERROR (.*)$", output, re.MULTILINE)
    return {"status": "error", "first_failure": (errors[0] if errors else output[-2000:]), "seconds": seconds}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="run only the mutations whose family or name contains this")
    parser.add_argument("--list", action="store_true", help="check every snippet and list the mutations; run nothing")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run (with --only, for a quick look)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per pytest run")
    parser.add_argument("--name", default="rule_mutations", help="results file name in benchmarks/results/")
    args = parser.parse_args(argv)

    source = REPO_ROOT / "src"
    every = mutations()
    chosen = [m for m in every if args.only in m.family or args.only in m.name]
    for mutation in every:  # every snippet must still be there, even when only some run
        check(mutation, source)
    if args.list:
        for m in chosen:
            print(f"{m.family:14} {m.kind:10} {m.name}")
        print(f"{len(chosen)} mutations, every snippet found exactly once")
        return 0

    records, started = [], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="assay-mutations-") as folder:
        copy = Path(folder) / "src"
        shutil.copytree(source, copy, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        where = subprocess.run([sys.executable, "-c", "import assay; print(assay.__file__)"], env=dict(
            os.environ, PYTHONPATH=str(copy)), capture_output=True, text=True, cwd=REPO_ROOT).stdout.strip()
        if not where.startswith(str(copy)):
            raise SystemExit(f"the tests would import assay from {where!r}, not from the mutated copy {copy}")
        baseline_tests = sorted({t for m in chosen for t in (*FAMILY_TESTS[m.family], *COMMON)})
        if not args.no_baseline:
            baseline = run_tests(copy, baseline_tests, args.timeout)
            print(f"baseline ({len(baseline_tests)} files): {baseline['status']} in {baseline['seconds']} s", flush=True)
            if baseline["status"] != "passed":
                raise SystemExit(f"the unmutated tests do not pass: {baseline['first_failure']}")
        for mutation in chosen:
            target = copy / mutation.file
            original = target.read_text()
            target.write_text(check(mutation, source))
            try:
                result = run_tests(copy, [*FAMILY_TESTS[mutation.family], *COMMON], args.timeout)
            finally:
                target.write_text(original)
            records.append({**asdict(mutation), **result})
            print(f"{mutation.family:14} {mutation.kind:10} {result['status']:7} {result['seconds']:6.1f} s  "
                  f"{mutation.name}  {result['first_failure'][:120]}", flush=True)

    caught = sum(r["status"] == "caught" for r in records)
    missed = [r for r in records if r["status"] == "passed"]
    broken = [r for r in records if r["status"] == "error"]
    families = sorted({r["family"] for r in records})
    rows = [[r["family"], r["kind"], r["name"], r["status"], r["first_failure"].replace("|", "\\|") or "—",
             r["seconds"]] for r in records]
    table = (f"Rule mutations (each bound moved inward by {SHIFT}): caught {caught} of {len(records)}, "
             f"{len(families)} families, {time.perf_counter() - started:.0f} s\n\n"
             + markdown_table(["family", "kind", "mutation", "status", "first failing test", "s"], rows))
    payload = {"shift": float(SHIFT), "caught": caught, "total": len(records), "families": families,
               "baseline_tests": baseline_tests, "records": records}
    json_path, md_path = write_results(args.name, payload, table)
    print(f"caught {caught} of {len(records)}; missed {len(missed)}; errors {len(broken)}; wrote {json_path}, {md_path}")
    for r in missed:
        print(f"MISSED: {r['family']} / {r['name']}")
    for r in broken:
        print(f"ERROR: {r['family']} / {r['name']}: {r['first_failure'][:300]}")
    return 2 if broken else (1 if missed else 0)


if __name__ == "__main__":
    sys.exit(main())
