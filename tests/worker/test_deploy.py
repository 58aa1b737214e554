"""deploy/ is on paper, but what it names must exist: the metric the autoscaler reads, the worker's
options and ports, the resolver's RBAC."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from streamjudge import semconv
from streamjudge.worker import _cli

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def _kind(name: str, kind: str) -> dict[str, Any]:
    [doc] = [d for d in _docs(name) if d["kind"] == kind]
    return doc


def test_the_autoscaler_reads_the_queue_depth_metric_the_worker_serves() -> None:
    hpa = _kind("hpa.yaml", "HorizontalPodAutoscaler")
    [metric] = hpa["spec"]["metrics"]
    served = semconv.METRIC_QUEUE_DEPTH.replace(".", "_")  # as GET /metrics names it
    assert metric["pods"]["metric"]["name"] == served
    adapter = yaml.safe_load(_kind("prometheus-adapter.yaml", "ConfigMap")["data"]["config.yaml"])
    assert adapter["rules"][0]["name"]["as"] == served
    assert hpa["spec"]["scaleTargetRef"]["name"] == _kind("worker.yaml", "Deployment")["metadata"]["name"]


def test_the_worker_pods_run_the_worker_command_with_options_it_has() -> None:
    dep = _kind("worker.yaml", "Deployment")
    [container] = dep["spec"]["template"]["spec"]["containers"]
    parser = argparse.ArgumentParser()
    _cli.add_arguments(parser)
    assert container["args"][0] == "worker"
    args = parser.parse_args(container["args"][1:])  # exits on an unknown option
    grace = dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert args.shutdown_timeout < grace  # flushed and marked before the kubelet's SIGKILL
    ports = {p["containerPort"] for p in container["ports"]}
    assert {int(args.grpc.rsplit(":", 1)[1]), int(args.http.rsplit(":", 1)[1])} == ports
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"


def test_the_gateway_resolves_the_headless_worker_service_it_may_watch() -> None:
    config = yaml.safe_load(_kind("gateway.yaml", "ConfigMap")["data"]["config.yaml"])
    resolver = config["exporters"]["load_balancing"]["resolver"]["k8s"]
    svc = _kind("worker.yaml", "Service")
    assert resolver["service"] == f"{svc['metadata']['name']}.{svc['metadata']['namespace']}"
    assert svc["spec"]["clusterIP"] == "None"
    assert config["exporters"]["load_balancing"]["routing_key"] == "traceID"
    role = _kind("gateway.yaml", "Role")
    assert {"get", "list", "watch"} <= set(role["rules"][0]["verbs"])
    assert role["rules"][0]["resources"] == ["endpointslices"]


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e for e in container.get("env", [])}


def test_nothing_binds_every_interface_and_the_workers_take_exports_from_the_gateway_only() -> None:
    worker = _kind("worker.yaml", "Deployment")
    [container] = worker["spec"]["template"]["spec"]["containers"]
    assert not any("0.0.0.0" in a for a in container["args"])
    assert _env(container)["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert "0.0.0.0" not in _kind("gateway.yaml", "ConfigMap")["data"]["config.yaml"]
    policies = {d["metadata"]["name"]: d for d in _docs("networkpolicy.yaml")}
    wp = policies["streamjudge-worker"]["spec"]
    assert wp["podSelector"]["matchLabels"] == worker["spec"]["template"]["metadata"]["labels"]
    gateway_labels = _kind("gateway.yaml", "Deployment")["spec"]["template"]["metadata"]["labels"]
    otlp = [r for r in wp["ingress"] if {"protocol": "TCP", "port": 4317} in r["ports"]]
    assert [r["from"] for r in otlp] == [[{"podSelector": {"matchLabels": gateway_labels}}]]
    gp = policies["streamjudge-gateway"]["spec"]
    assert not any("ipBlock" in f for r in gp["ingress"] for f in r["from"])  # nothing from outside


def test_the_gateway_sends_the_bearer_token_the_workers_require() -> None:
    [worker] = _kind("worker.yaml", "Deployment")["spec"]["template"]["spec"]["containers"]
    [gateway] = _kind("gateway.yaml", "Deployment")["spec"]["template"]["spec"]["containers"]
    secret = _env(worker)[_cli.TOKEN_ENV]["valueFrom"]["secretKeyRef"]
    assert _env(gateway)[_cli.TOKEN_ENV]["valueFrom"]["secretKeyRef"] == secret
    config = yaml.safe_load(_kind("gateway.yaml", "ConfigMap")["data"]["config.yaml"])
    headers = config["exporters"]["load_balancing"]["protocol"]["otlp"]["headers"]
    assert headers["authorization"] == "Bearer ${env:" + _cli.TOKEN_ENV + "}"
