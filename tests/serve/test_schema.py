"""Property-based tests of the API from its own OpenAPI schema (schemathesis) against a real ``assay serve``.

Requests are generated from ``/openapi.json`` — valid ones and, in negative mode, ones that
break the schema — and sent to ``assay serve`` running as a process on loopback. For every one:
no 5xx, the status and the body conform to the schema, and a refused request (4xx) leaves the
number of stored decisions, keyed posts and monitors as it was. Seeded (derandomised) and bounded
in examples per operation, so it costs seconds.
"""

from __future__ import annotations

import sqlite3

import pytest

from tests.requirements import in_ci, missing_message
from tests.serve.servers import free_port, serve_process, stop_process

try:  # the schema is read when the module is collected: a missing package fails CI, skips elsewhere
    import schemathesis
except ImportError:
    if in_ci():
        raise
    pytest.skip(missing_message("schemathesis"), allow_module_level=True)

from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

EXAMPLES_PER_OPERATION = 20


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = tmp_path_factory.mktemp("schema")
    port = free_port()
    process = serve_process(f"sqlite:///{folder / 'schema.db'}", port, "--epsilon", "0.1", "--max-body-bytes", "65536")
    try:
        yield f"http://127.0.0.1:{port}", folder / "schema.db"
    finally:
        stop_process(process)


def stored(path) -> tuple[int, int, int]:
    """Decisions, keyed posts and monitors in the server's store (read beside it: SQLite in WAL mode)."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30) as connection:
        return tuple(connection.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
                     for table in ("decisions", "posts", "monitors"))


def served_schema() -> dict:
    """The OpenAPI schema ``assay serve`` publishes at /openapi.json (the same app's; routes only, no store)."""
    from assay.serve.app import create_app

    return create_app(None).openapi()


schema = schemathesis.openapi.from_dict(served_schema())


@schema.parametrize()
@settings(max_examples=EXAMPLES_PER_OPERATION, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
def test_generated_requests_get_no_5xx_and_answers_that_conform(case, served):
    url, path = served
    if case.path_parameters and case.method != "PUT":
        # Random monitor names would almost always be 404: aim at the monitor that exists (PUT keeps its
        # generated names, so monitors are created too).
        case.path_parameters["name"] = "default"
    before = stored(path)
    response = case.call(base_url=url)
    case.validate_response(response, checks=[not_a_server_error, status_code_conformance, content_type_conformance,
                                              response_schema_conformance, negative_data_rejection])
    if response.status_code >= 400:
        assert stored(path) == before, (case.method, case.path, response.status_code, response.text[:200])
