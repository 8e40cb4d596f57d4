"""A progress bar on stderr when it is a terminal; nothing otherwise."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def wanted(progress: bool) -> bool:
    """Show a bar only when asked and stderr is an interactive terminal (never in logs or pipes)."""
    try:
        return bool(progress) and sys.stderr.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stderr
        return False


@contextmanager
def task_bar(total: int, description: str, enabled: bool) -> Iterator[Callable[[], None]]:
    """Yield ``advance()``, which moves a rich bar of ``total`` steps by one (a no-op when disabled)."""
    if not enabled or total == 0:
        yield lambda: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("eta"), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description or "tasks", total=total)
        yield lambda: bar.advance(task)
