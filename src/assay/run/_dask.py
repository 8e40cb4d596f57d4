"""The Dask backend of :func:`assay.run.run_tasks`: jobs on a running ``dask.distributed`` cluster.

Start a cluster with ``dask scheduler`` on one machine and ``dask worker tcp://HOST:8786
--nthreads 1`` on each worker machine (one thread per worker keeps torch jobs from competing for
cores); every worker needs assay installed. The function and items travel with cloudpickle.
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from assay.errors import AssayError, UnsupportedError

# Seconds to wait for the scheduler to answer before giving up with a clear error.
CONNECT_TIMEOUT = 10.0


def run_on_cluster(function, items, address: str, record, failure) -> None:
    """Map ``function`` over ``items`` on the cluster at ``address``; ``record(index, result)`` each."""
    try:
        from distributed import Client, as_completed
    except ImportError as exc:
        raise UnsupportedError("running on a Dask cluster needs dask.distributed: pip install 'distributed'") from exc
    _probe(address)
    try:
        client = Client(address, timeout=f"{CONNECT_TIMEOUT}s", set_as_default=False)
    except (OSError, ValueError, TimeoutError) as exc:
        raise AssayError(f"cannot connect to the Dask scheduler at {address!r}: {exc}") from exc
    futures = []
    try:
        futures = client.map(function, items, pure=False)
        index_of = {future.key: index for index, future in enumerate(futures)}
        for future in as_completed(futures, loop=client.loop):
            index = index_of[future.key]
            try:
                value = future.result()
            except Exception as exc:
                raise failure(index, exc) from exc
            record(index, value)
    except BaseException:
        if futures:
            client.cancel(futures)
        raise
    finally:
        client.close()


def _probe(address: str) -> None:
    """Fail fast, with a message that says how to fix it, when a tcp:// scheduler does not answer."""
    parts = urlsplit(address if "://" in address else f"tcp://{address}")
    if parts.scheme not in ("tcp", "tls"):
        return  # other transports (inproc, ucx, ws) are left to distributed itself
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        host, port = None, None
    if not host or port is None:
        raise AssayError(f"the scheduler address {address!r} needs a host and a port, e.g. 'tcp://10.0.0.5:8786'")
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT):
            pass
    except OSError as exc:
        raise AssayError(
            f"cannot reach the Dask scheduler at {address!r} ({exc}); start one with `dask scheduler` and "
            f"workers with `dask worker {address}`, or leave out the scheduler to use a local process pool"
        ) from exc
