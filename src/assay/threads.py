"""How many threads torch runs assay's analyses on.

Most networks users verify (ACAS Xu, safenlp, control policies, power-flow surrogates) have
tensors of a few hundred elements. torch's intra-op threads cost more than they save on those,
and on cores that other processes share they cost much more: bounding 3,000 boxes of a 40-input
Lyapunov network took 18.5 s on torch's default threads on a busy 2-core machine and 0.35 s on
one. So assay's public entry points (:func:`assay.verify.verify`, :func:`assay.bounds.compute_bounds`
and the analyses built on them) run a small network on one thread unless the caller says
otherwise, and give torch's setting back when they return. Large networks (images, generators)
keep torch's setting: their convolutions do gain from threads. A caller who wants another count
says so for a block of work::

    with assay.threads.use_threads(4):
        compute_bounds(...)        # and verify(...), preimage(...), ... on 4 threads

(``verify`` also takes ``threads=`` as an option), or for the rest of the process with
``assay.threads.set_threads(4)`` (a script's ``--threads`` flag).

The choice never changes an answer, only its speed.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

from assay.errors import OptionError

__all__ = ["SMALL_NETWORK_PARAMETERS", "SMALL_NETWORK_ELEMENTS", "one_thread_suffices", "threads_for",
           "torch_threads", "use_threads", "set_threads", "on_network_threads"]

# Below this many parameters in every one layer, a network's products are too small for torch's
# threads to pay off (and they lose much when the cores are shared): such networks run on one
# thread. Per layer, not in all: a transformer of 116,000 parameters in 9,000-parameter matrices
# (vit_2023 ibp_3_3_8) gains nothing from threads: beside one busy process two threads ran its
# PGD from the centre 4× slower (1.52 s against 0.37), and at load 5 its 100-s search bounded 3
# domains (392 on one thread beside one busy process); nn4sys mscn row 128 held in 7.5 s on one
# thread and timed out at 20 s on two. mnist 256x2's 784×256 layer keeps its threads.
# (torch is imported only where threads are set, so that the command line reads these cheaply.)
SMALL_NETWORK_PARAMETERS = 100_000
# ... and fewer elements than this over all its tensors: a convolutional network with few weights
# but large images (TinyYOLO: 92,205 parameters, 631,722 elements) has tensors large enough for
# two threads (yolo_2023 prop_000034 on 2 idle cores: 116 s on one thread, 90 s on two).
SMALL_NETWORK_ELEMENTS = 100_000


_SMALL: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def one_thread_suffices(network) -> bool:
    """Whether ``network``'s tensors are too small for threads to pay off (fewer than
    :data:`SMALL_NETWORK_PARAMETERS` parameters in each layer and :data:`SMALL_NETWORK_ELEMENTS`
    elements over all its tensors, one input). Remembered per network (a network's shapes do
    not change)."""
    try:
        return _SMALL[network]
    except (KeyError, TypeError):  # TypeError: an object that cannot be weakly referenced
        pass
    elements = sum(math.prod(shape) for shape in network.shapes)
    largest = max((layer.num_parameters for layer in network.layers), default=0)
    small = largest < SMALL_NETWORK_PARAMETERS and elements < SMALL_NETWORK_ELEMENTS
    try:
        _SMALL[network] = small
    except TypeError:
        pass
    return small


# The counts callers chose: set_threads's first (None: assay's default), then use_threads's blocks,
# innermost last. Process-wide, like torch's own setting that they choose.
_CHOSEN: list[int | None] = [None]


def threads_for(network, threads: int | None = None) -> int | None:
    """The torch threads an analysis of ``network`` runs on: ``threads`` when given, else the
    innermost :func:`use_threads` block's count, else 1 for a small network
    (:func:`one_thread_suffices`) and None (torch's setting) otherwise."""
    if threads is not None:
        return threads
    if _CHOSEN[-1] is not None:
        return _CHOSEN[-1]
    return 1 if one_thread_suffices(network) else None


@contextmanager
def use_threads(count: int) -> Iterator[None]:
    """Run the block, and every assay entry point called in it, on ``count`` (≥ 1) torch threads
    instead of assay's default; the caller's setting comes back afterwards."""
    _check_count(count, "use_threads")
    _CHOSEN.append(count)
    try:
        with torch_threads(count):
            yield
    finally:
        _CHOSEN.pop()


@contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """Run the block on ``count`` torch intra-op threads (None: as set) and restore the caller's
    setting afterwards, also when the block raises. Nested blocks asking for the setting already
    in force cost one query (branch and bound calls the bound engine thousands of times)."""
    import torch

    previous = torch.get_num_threads()
    if count is None or count == previous:
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def on_network_threads(function):
    """Decorate an entry point whose first argument is a network: it runs on
    :func:`threads_for` that network's threads (see the module docstring)."""

    @functools.wraps(function)
    def on_threads(network, *args, **kwargs):
        with torch_threads(threads_for(network)):
            return function(network, *args, **kwargs)

    return on_threads


def set_threads(count: int | None) -> None:
    """From now on run torch, and every assay entry point, on ``count`` (≥ 1) threads; None
    returns assay's entry points to their default (one thread for a small network)."""
    if count is not None:
        _check_count(count, "set_threads")
        import torch

        torch.set_num_threads(count)
    _CHOSEN[0] = count


def _check_count(count, owner: str) -> None:
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise OptionError(f"{owner} takes a thread count ≥ 1; got {count!r}")
