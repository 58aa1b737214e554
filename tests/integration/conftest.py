"""Fixtures: one real observability stack per test module (see infra.py)."""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from integration.infra import (
    HttpSink,
    InfraError,
    ObservabilityStack,
    collector_binary,
    jaeger_binary,
    run_http_sink,
)

# what a Langfuse project's keys look like; base64("<public>:<secret>") is the Basic auth credential
LANGFUSE_PUBLIC_KEY = "pk-lf-e2e-0000"
LANGFUSE_SECRET_KEY = "sk-lf-e2e-secret-0000"
LANGFUSE_AUTH = base64.b64encode(f"{LANGFUSE_PUBLIC_KEY}:{LANGFUSE_SECRET_KEY}".encode()).decode()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the collector and Jaeger before the first integration test runs.

    A first build takes minutes; done here it does not count against a test's timeout. ``make test`` has
    built them already (``test-infra``), so this is a cache hit there. A failure is remembered by
    ``make_binary`` and reported by the tests that need the binary.
    """
    here = Path(__file__).parent
    if any(
        here in Path(str(item.path)).parents and item.get_closest_marker("integration")
        for item in session.items
    ):
        with contextlib.suppress(InfraError):
            collector_binary()
            jaeger_binary()


@pytest.fixture(scope="module")
def langfuse_endpoint() -> Iterator[HttpSink]:
    """A local server standing in for Langfuse's OTLP endpoint (records path, headers, body)."""
    with run_http_sink() as sink:
        yield sink


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, langfuse_endpoint: HttpSink
) -> Iterator[ObservabilityStack]:
    """Jaeger, the collector (traces to Jaeger and the Langfuse stand-in), Prometheus, Alertmanager."""
    log_dir = tmp_path_factory.mktemp("observability")
    env = {
        "STREAMJUDGE_TRACES_EXPORTERS": "[otlp_grpc/jaeger, otlp_http/langfuse]",
        "LANGFUSE_OTLP_ENDPOINT": f"{langfuse_endpoint.url}/api/public/otel",
        "LANGFUSE_AUTH": LANGFUSE_AUTH,
    }
    with ObservabilityStack.start(log_dir, collector_extra_env=env) as running:
        yield running
