"""``assay serve``: run the exact monitor as a long-lived HTTP service with a durable store and a dashboard.

The command parses its options, opens the store (``sqlite:///PATH`` by default, or
``postgresql://...``), rebuilds every monitor it holds, creates the ``--name`` monitor from
``--epsilon``/``--metric`` when given, prints where it listens, and serves until Ctrl-C (or
SIGTERM), leaving a snapshot so that the next start replays nothing. The work is done by
:func:`assay.serve.serve`.
"""

from __future__ import annotations

import os

import typer

from assay.errors import OptionError

__all__ = ["serve"]


def _image_shape(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        shape = tuple(int(part) for part in text.replace("x", ",").split(",") if part.strip())
    except ValueError:
        shape = ()
    if len(shape) not in (2, 3):
        raise OptionError(f"--image-shape must be HEIGHT,WIDTH or HEIGHT,WIDTH,CHANNELS, e.g. 28,28; got {text!r}")
    return shape


def serve(
    epsilon: float = typer.Option(None, "--epsilon", "-e", help="Create (or check) the --name monitor with this input radius ε (inputs within ≤ ε are close). Leave out to serve only the monitors the store holds."),
    metric: str = typer.Option("linf", "--metric", help="Input distance of the --name monitor: linf, l2, l1 or cosine."),
    store: str = typer.Option("sqlite:///assay-monitor.db", "--store", help="Where decisions are kept: sqlite:///PATH (WAL mode) or postgresql://USER@HOST:PORT/DB."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on. Anything but loopback needs --token."),
    port: int = typer.Option(8000, "--port", help="Port to listen on."),
    token: str = typer.Option(None, "--token", envvar="ASSAY_TOKEN", help="Require this token (≥ 16 characters): `Authorization: Bearer TOKEN`; the dashboard asks for it once. Also read from ASSAY_TOKEN."),
    name: str = typer.Option("default", "--name", help="Name of the monitor --epsilon creates (its API path is /api/monitors/NAME)."),
    decision_column: str = typer.Option("prediction", "--decision-column", help="Key holding the decision in posted records."),
    decision_type: str = typer.Option(None, "--decision-type", help="Decisions of the --name monitor: string, number or boolean (default: the type of its first decision)."),
    index: str = typer.Option("auto", "--index", help="Index backend of the --name monitor: auto, grid, brute, kdtree, snn, bdd, partition or faiss."),
    image_shape: str = typer.Option(None, "--image-shape", help="Inputs are images of this shape (e.g. 28,28): the dashboard draws them."),
    max_body_bytes: int = typer.Option(4 * 1024 * 1024, "--max-body-bytes", help="Refuse request bodies larger than this (413)."),
    snapshot_every: int = typer.Option(100_000, "--snapshot-every", help="Snapshot a monitor every N decisions; a restart replays at most N."),
    sync: str = typer.Option("full", "--sync", help="SQLite: full (sync the log at every commit; survives power loss) or normal (survives a crash of the process)."),
) -> None:
    """Serve the monitor over HTTP: post decisions, list violations, and watch them in a browser dashboard."""
    from assay.serve import MonitorSpec
    from assay.serve import serve as run_server
    from assay.serve.auth import check_bind, describe_access

    if max_body_bytes < 1024:
        raise OptionError(f"--max-body-bytes must be ≥ 1024; got {max_body_bytes}")
    if sync.lower() not in ("full", "normal"):
        raise OptionError(f"--sync must be full or normal; got {sync!r}")
    if not 0 < port < 65536:
        raise OptionError(f"--port must be between 1 and 65535; got {port}")
    if token is None and os.environ.get("ASSAY_TOKEN") == "":
        token = ""  # click reads an empty variable as unset: an empty token must be refused, not ignored
    check_bind(host, token)
    default = None
    if epsilon is not None:
        default = MonitorSpec(name, epsilon, metric, decision_column=decision_column, index=index,
                              image_shape=_image_shape(image_shape), decision_type=decision_type)

    def ready(service) -> None:
        names = ", ".join(service.hub.names()) or "none yet (PUT /api/monitors/NAME)"
        typer.echo(f"assay serve: listening on {describe_access(host, port, token)}\n"
                   f"  monitors: {names}; store {service.hub.store.url}; rebuilt in {service.hub.restored_seconds:.2f} s; "
                   f"pid {os.getpid()}", err=True)

    run_server(store, host=host, port=port, token=token, default=default, max_body_bytes=max_body_bytes,
               snapshot_every=snapshot_every, synchronous=sync.upper(), on_ready=ready)


def print_serve_section(out, data: dict) -> None:
    """The service stop of ``assay demo`` (data from :func:`assay.serve.demo.demo_section`)."""
    out.print(f"As a service: `assay serve` ran at {data['url']} on a SQLite store; a client posted {data['decisions']:,} "
              f"loan decisions in {data['posts']} batches ({data['seconds']:.2f} s, each acknowledged once stored). The "
              f"server found {data['flagged']} flagged decisions ({data['pairs']} pairs within ε = {data['epsilon']:g}).")
    example = data["first_violation"]
    if example is not None:
        earlier, later = example["ids"]
        values = ", ".join(f"{name} {a:g}→{b:g}" for name, a, b in zip(data["features"], *example["inputs"]) if a != b)
        out.print(f"First one stored: #{later} got {example['decisions'][1]}, #{earlier} got {example['decisions'][0]} at "
                  f"distance {example['distance']:.3f} ({values}).")
    restart = data["restart"]
    same = all(restart[key] == data[key] for key in ("decisions", "flagged", "pairs"))
    out.print(f"The dashboard page answered {data['dashboard_status']}; restarted from its store, the monitor came back "
              f"in {restart['seconds']:.2f} s with {'the same' if same else 'DIFFERENT'} counts. "
              "`assay serve --epsilon 0.05` runs it for real (see the README).")
