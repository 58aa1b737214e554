"""A pull reader: the worker's metrics in the Prometheus text format on ``GET /metrics``.

The worker's metrics (its own, the judge pool's and the judge processor's) are recorded through one
``MeterProvider``; this reader renders them on demand so a Prometheus scrape (and the HorizontalPodAutoscaler
behind a metrics adapter) reads the queue depth without a collector in between. OTLP push is separate.
"""

from __future__ import annotations

import math
import re
import threading
from typing import Any

from opentelemetry.sdk.metrics.export import (
    Gauge,
    Histogram,
    MetricReader,
    MetricsData,
    Sum,
)

_NAME = re.compile(r"[^a-zA-Z0-9_:]")


def _name(name: str) -> str:
    return _NAME.sub("_", name)


def _labels(attributes: Any, extra: tuple[tuple[str, str], ...] = ()) -> str:
    items = [(str(k), str(v)) for k, v in (attributes or {}).items()] + list(extra)
    if not items:
        return ""
    body = ",".join(f'{_name(k)}="{_escape(v)}"' for k, v in sorted(items))
    return "{" + body + "}"


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", " ").replace('"', '\\"')


def _num(v: float) -> str:
    if isinstance(v, float) and math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v) if isinstance(v, float) else str(v)


class PrometheusText(MetricReader):
    """Collects on each :meth:`render` and formats the result (cumulative temporality)."""

    def __init__(self) -> None:
        super().__init__()
        self._latest: MetricsData | None = None
        self._lock = threading.Lock()

    def _receive_metrics(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
                         **kwargs: Any) -> None:
        self._latest = metrics_data

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        return None

    def render(self) -> str:
        """The current value of every metric, one Prometheus sample per line."""
        with self._lock:
            self._latest = None
            self.collect()
            data = self._latest
        if data is None:
            return ""
        lines: list[str] = []
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    lines.extend(self._format(metric))
        return "\n".join(lines) + "\n"

    @staticmethod
    def _format(metric: Any) -> list[str]:
        name = _name(metric.name)
        data = metric.data
        out: list[str] = []
        if isinstance(data, Sum):
            kind = "counter" if data.is_monotonic else "gauge"
            full = f"{name}_total" if data.is_monotonic else name
            out.append(f"# TYPE {full} {kind}")
            out.extend(f"{full}{_labels(p.attributes)} {_num(p.value)}" for p in data.data_points)
        elif isinstance(data, Gauge):
            out.append(f"# TYPE {name} gauge")
            out.extend(f"{name}{_labels(p.attributes)} {_num(p.value)}" for p in data.data_points)
        elif isinstance(data, Histogram):
            out.append(f"# TYPE {name} histogram")
            for p in data.data_points:
                running = 0
                for bound, count in zip((*p.explicit_bounds, math.inf), p.bucket_counts, strict=False):
                    running += count
                    le = (("le", _num(float(bound))),)
                    out.append(f"{name}_bucket{_labels(p.attributes, le)} {running}")
                out.append(f"{name}_sum{_labels(p.attributes)} {_num(p.sum)}")
                out.append(f"{name}_count{_labels(p.attributes)} {p.count}")
        return out
