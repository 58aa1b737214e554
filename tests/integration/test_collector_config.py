"""The shipped collector, Prometheus and Alertmanager configurations are valid for the real binaries."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from integration.infra import (
    COLLECTOR_DIR,
    OTEL_CONFIG,
    REPO,
    InfraError,
    collector_binary,
    jaeger_binary,
    prometheus_config,
    promtool_binary,
    system_binary,
)

pytestmark = pytest.mark.integration


def _run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, check=False)


def _validate(extra_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **extra_env}
    return _run([str(collector_binary()), "validate", "--config", str(OTEL_CONFIG)], env)


def test_otelcol_validate_accepts_the_default_jaeger_only_config() -> None:
    proc = _validate({})
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    "exporters", ["[otlp_grpc/jaeger, otlp_http/langfuse]", "[otlp_http/langfuse]", "[otlp_grpc/jaeger]"]
)
def test_otelcol_validate_accepts_each_trace_backend_choice(exporters: str) -> None:
    proc = _validate(
        {
            "STREAMJUDGE_TRACES_EXPORTERS": exporters,
            "LANGFUSE_OTLP_ENDPOINT": "https://langfuse.example/api/public/otel",
            "LANGFUSE_AUTH": "cGstbGYtMTpzay1sZi0x",
        }
    )
    assert proc.returncode == 0, proc.stderr


def test_otelcol_validate_rejects_an_unknown_trace_exporter() -> None:
    # proves validate really reads the env-chosen exporter list (a check that cannot fail proves nothing)
    proc = _validate({"STREAMJUDGE_TRACES_EXPORTERS": "[otlp_grpc/nowhere]"})
    assert proc.returncode != 0
    assert "otlp_grpc/nowhere" in proc.stderr


def test_the_manifest_holds_exactly_the_components_the_config_uses() -> None:
    proc = _run([str(collector_binary()), "components"])
    assert proc.returncode == 0, proc.stderr
    built = {line.split("name:", 1)[1].strip() for line in proc.stdout.splitlines() if "- name:" in line}
    config = OTEL_CONFIG.read_text()
    used = {
        "otlp", "memory_limiter", "batch", "delta_to_cumulative", "count", "signal_to_metrics",
        "otlp_grpc", "otlp_http", "prometheus", "health_check",
    }  # fmt: skip
    for name in used:
        assert f"{name}:" in config or f"{name}/" in config, name
    # the scale-out gateway (collector/gateway-config.yaml) adds the load_balancing exporter
    gateway = (COLLECTOR_DIR / "gateway-config.yaml").read_text()
    assert "load_balancing:" in gateway
    # the no-loss local collector (collector/otel-config-durable.yaml) adds the file_storage extension
    durable = (COLLECTOR_DIR / "otel-config-durable.yaml").read_text()
    assert "file_storage/" in durable
    assert built == used | {"load_balancing", "file_storage"}


def test_promtool_unit_tests_of_the_alert_rules_pass() -> None:
    proc = _run([str(promtool_binary()), "test", "rules", str(COLLECTOR_DIR / "alerts_test.yml")])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_promtool_check_config_accepts_the_shipped_and_the_test_prometheus_config(tmp_path: Path) -> None:
    shipped = _run([str(promtool_binary()), "check", "config", str(COLLECTOR_DIR / "prometheus.yml")])
    assert shipped.returncode == 0, shipped.stdout + shipped.stderr
    copy = tmp_path / "prometheus.yml"
    copy.write_text(prometheus_config("127.0.0.1:18889", "127.0.0.1:19093", "127.0.0.1:18888"))
    tested = _run([str(promtool_binary()), "check", "config", str(copy)])
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "12 rules found" in tested.stdout


def test_amtool_accepts_the_alertmanager_config() -> None:
    amtool = system_binary("amtool", "STREAMJUDGE_AMTOOL")  # ships with prometheus-alertmanager
    proc = _run([str(amtool), "check-config", str(COLLECTOR_DIR / "alertmanager.yml")])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_missing_system_binaries_are_reported_with_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("STREAMJUDGE_PROMTOOL", raising=False)
    assert shutil.which("promtool") is None
    with pytest.raises(InfraError, match="make test-infra"):
        promtool_binary()


@pytest.mark.parametrize("target", ["collector", "jaeger"])
def test_make_prints_the_cached_binary_path_last_and_does_not_rebuild(target: str) -> None:
    override = "STREAMJUDGE_OTELCOL" if target == "collector" else "STREAMJUDGE_JAEGER"
    if os.environ.get(override):
        pytest.skip(f"{override} names the binary: `make {target}` is not used")
    built = collector_binary() if target == "collector" else jaeger_binary()  # builds once if needed
    started = time.monotonic()
    proc = _run(["make", "-s", "--no-print-directory", "-C", str(REPO), target])
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert Path(last).is_absolute() and os.access(last, os.X_OK)
    assert Path(last) == built
    # the build output is outside the repository, and the second run is a cache hit
    assert REPO not in Path(last).parents
    assert elapsed < 10, f"`make {target}` took {elapsed:.1f}s on a cached build"
