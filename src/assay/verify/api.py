"""`verify`: decide whether a network satisfies a property, with a re-checked counterexample."""

from __future__ import annotations

import time

import numpy as np
import torch

from assay.bounds import plan_for
from assay.bounds.plan import require_bound_rules
from assay.errors import OptionError
from assay.nn.network import Network
from assay.threads import threads_for, torch_threads
from assay.verify.attack import from_center, search
from assay.verify.attack_model import has_sign
from assay.verify.deadline import Deadline
from assay.verify.input_split import InputSplitting, bound_root, family_root, input_round_size, screen_queries
from assay.verify.input_split import root_branch as input_root
from assay.verify.lp_refine import dense_layers, refine_bounds
from assay.verify.onnx_recheck import confirmed_counterexample
from assay.verify.operator_split import OperatorSplitting, round_size, tighten_root
from assay.verify.operator_split import root_branch as operator_root
from assay.verify.options import INPUT_SPLIT_MAX_INPUTS, VerifyOptions
from assay.verify.problem import UnsafeQuery, from_required, from_unsafe, from_vnnlib_queries
from assay.verify.relu_split import conjunction_searches, pooled_upper_bounds, refutes_every_conjunction, root_corners
from assay.verify.result import VerificationResult, VerificationStats, VerificationStatus
from assay.verify.search import SearchState, SearchStats, branch_and_bound
from assay.verify.table_cells import decide_by_cells

__all__ = ["verify", "verify_vnnlib", "VerifyOptions", "INPUT_SPLIT_MAX_INPUTS"]

# The share of the time left that tightening an open query's root may take (ReLU splitting; the
# general split's tighten_root too: on vit_2023 pgd_2_3_16 row 77 it takes 12 s of about 20).
TIGHTEN_SHARE = 0.25
# The share of the time left then that a dense network's LP refinement may take: on mnist 256x4
# it turns root gaps of 0.6–1.0 into ±0.1, which the search then closes far faster.
REFINE_SHARE = 0.5
# A binarised network (Sign layers) whose PGD from the centre found nothing gets no bound search
# when less than this many seconds are left: bounds through a Sign are ±1 wherever its input
# interval straddles 0. On traffic_signs_recognition_2023 (rows 0 and 15, ε = 1) the root's bounds
# alone, given 120 s, took 168–173 s (past their deadline) and refuted nothing. The attack gets
# the time left (random restarts after PGD from the centre), then the verdict is TIMEOUT (never
# HOLDS without a proof).
BINARISED_SEARCH_MIN_SECONDS = 600.0
# The share of the time left that the counterexample search (sampling, then PGD from 32 starts)
# may take before input splitting, which probes its open boxes with PGD itself (and starts after
# PGD from the centre has run). On a 64×64 cgan generator (5 inputs, 0.7 M parameters) the
# 32-start search took 200 of a holding query's 300 s on 2 loaded cores, and the search that
# proves it got the rest; ACAS Xu's attacks take under a second of their 11.6 s share.
INPUT_SPLIT_ATTACK_SHARE = 0.1


def verify(
    network: Network,
    input_set,
    spec=None,
    *,
    unsafe=None,
    options: VerifyOptions | None = None,
    rng: np.random.Generator | None = None,
    progress=None,
    **option_values,
) -> VerificationResult:
    """Decide "for every x in ``input_set``, f(x) lies in ``spec``" (or avoids ``unsafe``).

    Args:
        network: the network f.
        input_set: a :class:`~assay.sets.Box` over the network's input.
        spec: the required output region (an :class:`~assay.sets.OutputSpec` with one
            conjunction, e.g. ``argmax_is(k, n)``); or
        unsafe: the forbidden output region (an OutputSpec, e.g. a VNN-LIB query's
            ``unsafe_outputs``). Give exactly one of the two.
        options: a :class:`VerifyOptions` (default: its defaults); single options can also be
            given by name (``timeout=60``, ``strategy="relu"``, ...) and override it. A small
            network runs on one torch thread unless ``threads`` says otherwise (torch's setting
            is restored on return; see :mod:`assay.threads`).
        rng: randomness of the attack (default: a fixed seed, so runs are repeatable).
        progress: optional callable ``(fraction of the search settled, pending branches)``.

    Returns:
        :class:`VerificationResult`. HOLDS follows from sound bounds over a partition of the
        input set; VIOLATED carries an input whose float64 forward pass violates the property
        and, for a network loaded from an ONNX file, whose onnxruntime output on that file
        violates it too within the competition's tolerance (:mod:`assay.verify.onnx_recheck`;
        if not, the result is UNKNOWN with the reason).
    """
    options = VerifyOptions.build(options, **option_values)
    if (spec is None) == (unsafe is None):
        raise OptionError("verify takes exactly one of spec=(required output region) or unsafe=(forbidden outputs)")
    queries = from_required(network, input_set, spec) if spec is not None else from_unsafe(network, input_set, unsafe)
    with torch_threads(threads_for(network, options.threads)):
        return _run(network, queries, options, rng, progress)


def verify_vnnlib(network: Network, prop, *, options: VerifyOptions | None = None, rng=None, progress=None,
                  **option_values) -> VerificationResult:
    """Verify a :class:`~assay.sets.VnnlibProperty`: it holds iff every query is infeasible.

    Options as for :func:`verify`.
    """
    options = VerifyOptions.build(options, **option_values)
    with torch_threads(threads_for(network, options.threads)):
        return _run(network, from_vnnlib_queries(network, prop.queries), options, rng, progress)


# From this many queries on (input or operator splitting), their boxes are bounded together before
# any query gets its own attack and root bounds (see screen_queries): below it, those per-query
# steps cost little and the attack finds violations first.
SCREEN_MIN_QUERIES = 16


def _run(network, queries, options: VerifyOptions, rng, progress) -> VerificationResult:
    require_bound_rules(network)  # before the attack: every answer rests on the bound engine
    # Inputs that the property fixes to one value cost input splitting nothing: count those that vary.
    varying = max((int((query.upper > query.lower).sum()) for query in queries), default=network.input_size)
    plan = plan_for(network, torch.float64)
    general = plan.is_general
    strategy = options.strategy_for(varying, relu_splitting=not plan.has_nonlinear_operators)
    method, dtype, batch_size = options.method, options.dtype, options.batch_size
    rng = rng if rng is not None else np.random.default_rng(0)
    started = time.monotonic()
    deadline = Deadline(started + options.timeout)
    stats = SearchStats()
    searches: list[SearchState] = []
    total_queries = len(queries)  # reported as given: screening and cells narrow `queries` below

    def finish(status, found=None, query=None, reason=None):
        counterexample = None
        if found is not None:
            # Confirmed by assay's forward pass; the original ONNX file has the last word.
            counterexample, reason = confirmed_counterexample(network, query, found)
            if counterexample is None:
                status = VerificationStatus.UNKNOWN
        return VerificationResult(status, counterexample, VerificationStats(
            **stats.to_json(), queries=total_queries, strategy=strategy, seconds=time.monotonic() - started,
        ), tuple(searches), reason)

    # A box that varies only in table keys (a patch's position) is decided cell by cell.
    undecided = []
    for query in queries:
        decision = decide_by_cells(network, query, method=method, dtype=dtype, stats=stats, deadline=deadline)
        if decision is None:
            undecided.append(query)
        elif decision.found is not None:
            return finish(VerificationStatus.VIOLATED, decision.found, query)
    if not undecided:
        return finish(VerificationStatus.HOLDS)
    queries = undecided

    families: list[list[UnsafeQuery]] = []  # many queries searched as one each (InputSplitting's family)
    if strategy in ("input", "operator"):
        # Sound bounds on the whole box settle easy queries at a fraction of the attack's cost;
        # the others start branching from these bounds. On a network with general operators
        # (a generator, a transformer) the root's bounds can cost minutes: PGD from the centre
        # goes first, as for ReLU splitting.
        if len(queries) >= SCREEN_MIN_QUERIES:
            # Many boxes (a VNN-LIB disjunction): bounded together first, a batch per call; only
            # the queries that survive get the per-query attack, root bounds and search below.
            # Where input-splitting searches over many of them at once follow (families, below),
            # their first rounds bound every box as the linear screen would: only intervals screen.
            family_follows = strategy == "input" and bool(_families(queries)[0])
            left = screen_queries(network, queries, method=method, dtype=dtype, stats=stats, deadline=deadline,
                                  linear=not family_follows)
            if left is None:
                return finish(VerificationStatus.TIMEOUT)
            if not left:
                return finish(VerificationStatus.HOLDS)
            queries = left
            if strategy == "input":
                # Still many: one input-splitting search over all of those of one structure (each
                # box with its own query's rows), instead of an attack, root bounds and a search
                # per query; the few of another structure (mscn_dual 2260: 1 of 2,259 queries has
                # two disjuncts over one box) are small boxes of the same kind, searched as a
                # family of their own (their own searches bounded each box by CROWN's backward
                # walks, ~0.5 s a box, and attacked each first: mscn_dual 10450's 11 took ~60 s).
                families, queries = _families(left, least=1 if family_follows else SCREEN_MIN_QUERIES)
        open_queries = []
        # Many inputs through Sign layers: no bound search on a short deadline (see
        # BINARISED_SEARCH_MIN_SECONDS); input splitting (few inputs) makes every Sign stable on
        # small boxes and keeps its search.
        binarised = strategy == "operator" and has_sign(network)
        given_up = []
        for query in queries:
            if deadline.passed():
                return finish(VerificationStatus.TIMEOUT)
            if general and options.attack_restarts:
                stats.attacks += 1
                found = from_center(network, query, deadline=deadline)
                if found is not None:
                    return finish(VerificationStatus.VIOLATED, found, query)
            if binarised and deadline.remaining() < BINARISED_SEARCH_MIN_SECONDS:
                given_up.append(query)
                continue
            root = bound_root(network, query, method=method, dtype=dtype, stats=stats, deadline=deadline)
            if not root.refuted:
                open_queries.append((query, root))
        if given_up:
            # What time is left goes to the attack (random restarts), not to bounds.
            for query in given_up:
                if options.attack_restarts and not deadline.passed():
                    stats.attacks += 1
                    found = search(network, query, rng, restarts=options.attack_restarts, deadline=deadline)
                    if found is not None:
                        return finish(VerificationStatus.VIOLATED, found, query)
            return finish(VerificationStatus.TIMEOUT, reason=(
                "binarised network (Sign layers): the attack found no counterexample, and bounds through Sign "
                f"layers rarely decide a box of {varying} inputs within the time left"))
    else:
        # The same for ReLU splitting: the root (the whole box, no split) is bounded once per
        # query for all its conjunctions before any attack, and queries it refutes are done.
        open_queries = []
        for query in queries:
            if deadline.passed():
                return finish(VerificationStatus.TIMEOUT)
            if options.attack_restarts:
                # PGD from the centre first: far cheaper than bounding a wide network's root, and
                # it decides most violated ε-balls (the search below still attacks in earnest).
                stats.attacks += 1
                found = from_center(network, query, deadline=deadline)
                if found is not None:
                    return finish(VerificationStatus.VIOLATED, found, query)
            # A network loaded with MaxPool is bounded first with its pooling windows whole: that
            # settles most such queries for a fraction of the lowered network's root.
            pooled = pooled_upper_bounds(network, query, dtype=dtype, deadline=deadline)
            if pooled is not None:
                stats.bound_calls += 1
                if refutes_every_conjunction(query, pooled):
                    continue
            plans = conjunction_searches(network, query, dtype=dtype, deadline=deadline, pooled_upper=pooled)
            stats.bound_calls += 1
            if not all(plan.refuted_at_root for plan, _ in plans):
                open_queries.append((query, plans))
    if options.attack_restarts:
        for query, root in open_queries:
            stats.attacks += 1
            # ReLU splitting: PGD starts at the corners where the root's linear bounds peak, too
            guides = root_corners(root) if strategy == "relu" else None
            # Input splitting probes its open boxes with PGD as it goes: the attack before it
            # gets a share of the time left (see INPUT_SPLIT_ATTACK_SHARE)
            attack_deadline = deadline
            if strategy == "input":
                attack_deadline = deadline.share(INPUT_SPLIT_ATTACK_SHARE)
            found = search(network, query, rng, restarts=options.attack_restarts, deadline=attack_deadline,
                           guides=guides)
            if found is not None:
                return finish(VerificationStatus.VIOLATED, found, query)
    if strategy in ("operator", "relu"):
        # A query that neither the root's bounds nor the attack settled gets a search; first its
        # root is tightened once (intermediate α-CROWN, costly but inherited by every domain of the
        # search), which often refutes it outright.
        tighten = _tightened_operator_root if strategy == "operator" else _tightened_relu_roots
        tightened = []
        for query, root in open_queries:
            if deadline.passed():
                return finish(VerificationStatus.TIMEOUT)
            root, still_open = tighten(network, query, root, dtype, stats, deadline)
            if still_open:
                tightened.append((query, root))
        open_queries = tightened
    memory_limit = options.memory_limit_bytes

    def memory_guard(state: SearchState) -> bool:
        # Past the memory budget the search stops (UNKNOWN) rather than exhaust the machine.
        return state.pending_bytes > memory_limit

    # one search over each family (probing attacks inside it), then the other open queries'
    planned = [(family[0], None, family) for family in families] + [(q, root, None) for q, root in open_queries]
    worst = VerificationStatus.HOLDS
    for query, root, family in planned:
        if deadline.passed():
            return finish(VerificationStatus.TIMEOUT)
        if family is not None:
            plans = [(InputSplitting(network, query, method=method, dtype=dtype, family=family), family_root(family))]
            size = batch_size
        elif strategy == "input":
            plans = [(InputSplitting(network, query, method=method, dtype=dtype, root=root), input_root(query))]
            size = input_round_size(network, batch_size)
        elif strategy == "operator":
            plans = [(OperatorSplitting(network, query, method=method, dtype=dtype, root=root), operator_root(query))]
            size = round_size(network, batch_size)
        else:  # one search per conjunction: the query holds when every one is refuted
            plans = [(plan, state) for plan, state in root if not plan.refuted_at_root]
            size = min(batch_size, 256)
        for number, (plan, state) in enumerate(plans):
            report = None
            if progress is not None:
                report = (lambda done, pending, g=number, n=len(plans): progress((g + done) / n, pending))
            outcome = branch_and_bound(plan, state, deadline, batch_size=size, stats=stats,
                                       keep_closed=options.keep_closed, progress=report, stop=memory_guard)
            searches.append(outcome.state)
            if outcome.status is VerificationStatus.VIOLATED:
                return finish(outcome.status, outcome.found, query if family is None else plan.query_of(outcome.found))
            if outcome.status is VerificationStatus.TIMEOUT:
                return finish(outcome.status)
            if outcome.status is VerificationStatus.UNKNOWN:
                worst = VerificationStatus.UNKNOWN
    return finish(worst)


def _tightened_operator_root(network, query, root, dtype, stats, deadline: Deadline):
    """The general split's root after :func:`tighten_root`, within a share of the time left (the
    search keeps the larger part), and whether it is still open."""
    root = tighten_root(network, query, root, dtype=dtype, stats=stats, deadline=deadline.share(TIGHTEN_SHARE))
    return root, not root.refuted


def _tightened_relu_roots(network, query, plans, dtype, stats, deadline: Deadline):
    """ReLU splitting's per-conjunction plans with their roots' pre-activation bounds tightened
    (within a share of the time left), and whether some conjunction is still open."""
    plans = conjunction_searches(network, query, dtype=dtype, deadline=deadline.share(TIGHTEN_SHARE), tighten=plans)
    stats.bound_calls += 1
    if not all(plan.refuted_at_root for plan, _ in plans) and dense_layers(network) is not None:
        # A dense network's deeper layers are tightened further by LP (certified), within
        # another share of the time left; the root is bounded again on them.
        budget = deadline.share(REFINE_SHARE)
        root = plans[0][0].root_bounds.intermediate
        refined = refine_bounds(network, query.lower, query.upper, root, deadline=budget.at)
        plans = conjunction_searches(network, query, dtype=dtype, deadline=deadline, tighten=plans, refined=refined)
        stats.bound_calls += 1
    return plans, not all(plan.refuted_at_root for plan, _ in plans)


def _families(queries: list[UnsafeQuery], least: int = SCREEN_MIN_QUERIES) -> tuple[list[list[UnsafeQuery]],
                                                                                       list[UnsafeQuery]]:
    """The queries that share a structure of conjunctions (rows per conjunction, outputs) with at
    least ``least`` − 1 others, one list per structure (each searched as one family), and the
    rest (in order)."""
    by_structure: dict[tuple, list[UnsafeQuery]] = {}
    for query in queries:
        by_structure.setdefault((tuple(query.C.shape), tuple(query.groups.tolist())), []).append(query)
    families = [group for group in by_structure.values() if len(group) >= least]
    many = {id(q) for group in families for q in group}
    return families, [q for q in queries if id(q) not in many]
