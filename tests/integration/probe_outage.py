"""A trace backend down for a while under steady span traffic: how many spans were lost, and how many of
those the application counted in ``streamjudge.export.failures``. Prints one JSON line.

    PYTHONPATH=src:tests python tests/integration/probe_outage.py [--outage 60] [--rate 300] [--durable]

The application is what the distro builds (the SDK's BatchSpanProcessor with its default 2,048-span queue
and the OTLP/HTTP exporter), its exporters wrapped by streamjudge's ``count_export_failures``. The backend
refuses connections during the outage, then comes back. With ``--durable`` the application exports to a
local collector running collector/otel-config-durable.yaml in front of that backend. Not a test: the
figures in docs/reliability.md come from it.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from integration.infra import free_port
from integration.test_collector_durable import _Backend, _collector
from streamjudge.exporters._counting import count_export_failures


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--outage", type=float, default=60.0)
    ap.add_argument("--rate", type=float, default=300.0, help="spans per second")
    ap.add_argument("--durable", action="store_true")
    args = ap.parse_args()
    backend_port = free_port()
    with ExitStack() as stack:
        endpoint = f"http://127.0.0.1:{backend_port}"
        if args.durable:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            (tmp / "queue").mkdir()
            env = {
                "STREAMJUDGE_COLLECTOR_OTLP_GRPC_ENDPOINT": f"127.0.0.1:{free_port()}",
                "STREAMJUDGE_COLLECTOR_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{free_port()}",
                "STREAMJUDGE_COLLECTOR_HEALTH_ENDPOINT": f"127.0.0.1:{free_port()}",
                "STREAMJUDGE_COLLECTOR_TELEMETRY_PORT": str(free_port()),
                "STREAMJUDGE_COLLECTOR_STORAGE_DIR": str(tmp / "queue"),
                "STREAMJUDGE_COLLECTOR_BACKEND_ENDPOINT": endpoint,
            }
            stack.enter_context(_collector(tmp, env, "otelcol-durable"))
            endpoint = f"http://{env['STREAMJUDGE_COLLECTOR_OTLP_HTTP_ENDPOINT']}"
        provider = TracerProvider()
        bsp = BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint + "/v1/traces"))
        provider.add_span_processor(bsp)
        count_export_failures(provider)
        tracer = provider.get_tracer("probe")
        produced: set[tuple[int, int]] = set()
        stop = threading.Event()

        def produce() -> None:
            period = 1.0 / args.rate
            nxt = time.monotonic()
            while not stop.is_set():
                with tracer.start_as_current_span("s") as span:
                    ctx = span.get_span_context()
                    produced.add((ctx.trace_id, ctx.span_id))
                nxt += period
                time.sleep(max(0.0, nxt - time.monotonic()))

        producer = threading.Thread(target=produce)
        producer.start()
        time.sleep(args.outage)  # the backend is down: nothing listens on its port
        backend = _Backend(backend_port)
        time.sleep(5.0)  # traffic goes on with the backend back
        stop.set()
        producer.join()
        provider.force_flush(60_000)
        deadline = time.monotonic() + 120
        while not set(backend.seen) >= produced and time.monotonic() < deadline and args.durable:
            time.sleep(0.2)
        provider.shutdown()
        exporter = bsp._batch_processor._exporter
        failed = dict(getattr(exporter, "failed", {}))
        delivered = len(set(backend.seen) & produced)
        backend.stop()
    print(json.dumps({"outage_s": args.outage, "durable": args.durable, "produced": len(produced),
                      "delivered": delivered, "lost": len(produced) - delivered,
                      "counted": sum(failed.values()), "counted_by_reason": failed}), flush=True)


if __name__ == "__main__":
    main()
