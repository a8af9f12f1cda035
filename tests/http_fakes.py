"""A canned HTTP server for CLI tests: answers each (method, path) from a table, records every request."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

NOT_FOUND = (404, {"error_code": "CDC:ErrNotFound", "error_msg": "no"})


class CannedHttp:
    """Answers (method, path) with `answers[(method, path)]`: one (status, body), or a list of them served in
    order (the last one repeats). Unknown paths get a 404 in the server's error shape. `requests` records
    (method, path, json body) of every request."""

    def __init__(self, answers: dict[tuple[str, str], Any] | None = None) -> None:
        self.answers: dict[tuple[str, str], Any] = answers if answers is not None else {}
        self.requests: list[tuple[str, str, Any]] = []
        me = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                me.requests.append((self.command, self.path, json.loads(self.rfile.read(n)) if n else None))
                answer = me.answers.get((self.command, self.path)) or NOT_FOUND
                if isinstance(answer, list):
                    answer = answer.pop(0) if len(answer) > 1 else answer[0]
                status, payload = answer
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _answer  # noqa: N815

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
