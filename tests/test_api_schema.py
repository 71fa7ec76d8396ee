"""schemathesis against the live OpenAPI of the app (in-process ASGI, bounded examples).

Every operation of the schema (REST routes, health, OTLP) is exercised with generated requests;
checks: no 5xx, status codes and content types documented, bodies match the response models,
schema-valid requests accepted and schema-invalid ones refused.
Operations are driven with plain hypothesis (``operation.as_strategy()``) rather than the
schemathesis pytest plugin, which does not load under this pytest.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from api_store import build, consistent_settings
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import positive_data_acceptance

from api.app import create_app
from ioe.settings import Settings

EXAMPLES = 25
# The OTLP body is protobuf or OTLP/JSON: its schema cannot say which bytes are a valid
# ExportTraceServiceRequest, so schema-valid random bodies are rightly refused with 400 there.
# Likewise a SQL text: a schema-valid string is rarely a SELECT over the store, and is refused (400).
OPAQUE = {"/v1/traces": [positive_data_acceptance], "/api/v1/query": [positive_data_acceptance]}


@pytest.fixture(scope="module")
def api_schema() -> Iterator[object]:
    st = build()
    app = create_app(Settings(store_path=":memory:"), st)
    yield schemathesis.openapi.from_asgi("/openapi.json", app)
    st.close()


def operations(schema: object) -> list[object]:
    return [r.ok() for r in schema.get_all_operations()]  # type: ignore[attr-defined]


def test_api_conforms_to_its_openapi(api_schema: object) -> None:
    ops = operations(api_schema)
    assert len(ops) >= 15
    for op in ops:

        @given(case=op.as_strategy())  # type: ignore[attr-defined]
        @settings(
            max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None
        )
        def run(case: schemathesis.Case) -> None:
            consistent_settings(case).call_and_validate(excluded_checks=OPAQUE.get(case.path, []))

        run()
