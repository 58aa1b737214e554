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
