"""A local OTLP/HTTP receiver that takes spans and drops them: the far end of a server
measured with tracing on (issue #42's cost criterion), so the export's own cost is the
server's and the collector's is nobody's.

    python -m bench.otlp_sink --port 4318 &
    python -m bench.compare … --b-env OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318

It answers every POST with 200 and an empty protobuf body (an empty
``ExportTraceServiceResponse``: all accepted), and prints how many requests and bytes it
took when stopped (SIGINT or SIGTERM), so a run can show the spans did arrive.
"""

from __future__ import annotations

import argparse
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

received = {"requests": 0, "bytes": 0}


class Sink(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        received["requests"] += 1
        received["bytes"] += length
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return  # one line per export would be the sink's main cost


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.otlp_sink", description=__doc__)
    p.add_argument("--port", type=int, default=4318, help="loopback port (OTLP/HTTP's 4318)")
    args = p.parse_args(argv)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Sink)

    def stop(*_: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        print(
            f"otlp sink: {received['requests']} exports, {received['bytes']} bytes", file=sys.stderr
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
