"""Run ``phoenix serve`` with its OTLP gRPC port bound to 127.0.0.1 instead of every interface.

Phoenix binds gRPC on ``[::]:PHOENIX_GRPC_PORT`` with no setting to change the host (PHOENIX_HOST only
moves the HTTP server). The tests must not open ports beyond loopback, so this wrapper, run with Phoenix's
own interpreter, rewrites the address before the server binds it. Usage: ``python phoenix_loopback.py``.
"""

import sys

import grpc.aio

_server = grpc.aio.server


def _loopback_server(*args, **kwargs):  # type: ignore[no-untyped-def]
    server = _server(*args, **kwargs)
    add_insecure_port = server.add_insecure_port
    add_secure_port = server.add_secure_port
    server.add_insecure_port = lambda address: add_insecure_port(address.replace("[::]:", "127.0.0.1:", 1))
    server.add_secure_port = lambda address, creds: add_secure_port(
        address.replace("[::]:", "127.0.0.1:", 1), creds
    )
    return server


grpc.aio.server = _loopback_server

from phoenix.server.main import main  # noqa: E402

sys.argv = ["phoenix", "serve"]
main()
