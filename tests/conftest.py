"""Shared fixtures: real Prometheus and VictoriaMetrics servers, started once per test session.

Outside CI a missing binary skips the tests that need it (with the install hint); in CI
(``CI`` set) it is a failure, so a broken install cannot pass as a green run.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from servers import (  # noqa: E402
    PROMETHEUS_BIN,
    VICTORIA_METRICS_BIN,
    Prometheus,
    VictoriaMetrics,
    require_binary,
)


@pytest.fixture(scope="session")
def prometheus(tmp_path_factory) -> Prometheus:
    """One Prometheus for the session (global scrape interval 1 s).

    Add targets with ``prometheus.add_scrape_target(job, "127.0.0.1:PORT")``; use a job name
    unique to your test, since the server is shared (each add takes ~5 s: Prometheus applies
    discovery changes at most every 5 s). ``prometheus.remove_scrape_target(job)`` when done.
    """
    require_binary(PROMETHEUS_BIN, "Prometheus")
    server = Prometheus(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n",
        tmp_path_factory.mktemp("prometheus"),
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def victoriametrics(tmp_path_factory) -> VictoriaMetrics:
    """One VictoriaMetrics for the session; OTLP/HTTP at ``victoriametrics.otlp_metrics_url``."""
    require_binary(VICTORIA_METRICS_BIN, "VictoriaMetrics")
    server = VictoriaMetrics(tmp_path_factory.mktemp("victoriametrics"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgres():
    """One throwaway PostgreSQL cluster for the session (loopback, trust auth); make a database per
    test with ``postgres.create_database(name)``, which returns its URL."""
    from postgres import PG_BIN, Postgres

    reason = None
    if not Postgres.available():
        reason = f"PostgreSQL not found at {PG_BIN or '/usr/lib/postgresql/*/bin'}; run `bash .ci/install.sh`"
    elif importlib.util.find_spec("psycopg") is None:
        reason = "psycopg (the PostgreSQL driver) is not installed; run `bash .ci/install.sh`"
    if reason and os.environ.get("CI"):
        pytest.fail(f"CI: {reason}", pytrace=False)
    if reason:
        pytest.skip(reason)
    server = Postgres().start()
    yield server
    server.stop()


SERVER_FIXTURES = {"prometheus", "victoriametrics", "postgres"}


def pytest_collection_modifyitems(config, items):
    """Tests that use a real-server fixture are ``slow`` without having to say so."""
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
