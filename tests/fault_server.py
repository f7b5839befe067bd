"""A fault-injecting OpenAI-compatible server. TEST FIXTURE ONLY: it does what real engines cannot
be made to do on demand. Real engines stay the main path of every other test.

The fault is chosen by a path prefix, so one server serves every fault:
    http://127.0.0.1:PORT/f/<fault>[:<arg>]/v1/chat/completions
    ok            a well-formed stream: <arg> content chunks (default 8), finish_reason, usage, [DONE]
    http500:N     the first N requests to this prefix answer 500 (then ok); http429:N likewise
    cut           content chunks, then the body ends cleanly without finish_reason/usage/[DONE]
    reset         content chunks, then the connection is dropped in the middle of the chunked body
    malformed     a `data:` line that is not JSON
    stream_error  a `data: {"error": ...}` event in the middle of the stream
    huge:MB       a well-formed stream whose single content chunk is MB megabytes
    huge500:MB    HTTP 500 with an MB-megabyte body
    slowloris     headers, then an SSE comment every 0.2 s forever: bytes flow, no token ever comes
    hang          reads the request, then never answers
    stall:K:S     every request streams 16 tokens 10 ms apart; the K-th request to this prefix (from 1)
                  waits S seconds before its first token (gap:K:S: between its 8th and 9th token)
Started with --never-ready, /health answers 503 forever. POST /reset clears the burst counters.
Started with --fault <fault>[:<arg>], a path without the /f/ prefix gets that fault: a server started
by the door (harness.Session.run, as a vLLM-dialect engine: it accepts and ignores --model) serves
its fault at the base URL the door measures.
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "fault-model"


class State:
    def __init__(self, never_ready: bool, fault: str = "ok"):
        self.never_ready = never_ready
        self.fault = fault  # the fault of paths without the /f/ prefix
        self.lock = threading.Lock()
        self.counts: dict[str, int] = {}

    def bump(self, key: str) -> int:
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + 1
            return self.counts[key]


def _chunk(content: str | None = None, finish: str | None = None, usage: dict[str, int] | None = None) -> bytes:
    body: dict[str, Any] = {"id": "x", "object": "chat.completion.chunk", "model": MODEL, "choices": []}
    if content is not None or finish is not None:
        body["choices"] = [{"index": 0, "delta": {"content": content or ""}, "finish_reason": finish}]
    if usage is not None:
        body["usage"] = usage
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FaultHTTPServer

    def log_message(self, fmt: str, *args: Any) -> None:
        print(f"{self.address_string()} {fmt % args}", flush=True)

    # ---- helpers --------------------------------------------------------------------------------
    def _json(self, status: int, data: Any) -> None:
        raw = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _start_chunked(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _send(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _end_chunked(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _split(self) -> tuple[str, str, str]:
        """(fault, arg, rest of the path) from /f/<fault>[:<arg>]/rest."""
        path = self.path.split("?", 1)[0]
        if path.startswith("/f/"):
            head, _, rest = path[3:].partition("/")
            fault, _, arg = head.partition(":")
            return fault, arg, "/" + rest
        fault, _, arg = self.server.state.fault.partition(":")
        return fault, arg, path

    # ---- routes ---------------------------------------------------------------------------------
    def do_GET(self) -> None:
        _, _, path = self._split()
        if path == "/health":
            if self.server.state.never_ready:
                self._json(503, {"error": {"message": "Loading model", "code": 503}})
            else:
                self._json(200, {"status": "ok"})
        elif path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        elif path == "/metrics":
            raw = b"# no metrics here\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)
        else:
            self._json(404, {"error": {"message": f"no route {path}"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        payload = json.loads(self.rfile.read(length) or b"{}")
        fault, arg, path = self._split()
        if path == "/reset":
            with self.server.state.lock:
                self.server.state.counts.clear()
            self._json(200, {"ok": True})
        elif path == "/tokenize":
            text = json.dumps(payload.get("messages") or payload.get("prompt") or "")
            self._json(200, {"tokens": list(range(len(text.split()))), "count": len(text.split())})
        elif path == "/v1/chat/completions":
            self._chat(fault, arg, payload)
        else:
            self._json(404, {"error": {"message": f"no route {path}"}})

    def _chat(self, fault: str, arg: str, payload: dict[str, Any]) -> None:
        n = int(arg) if arg and fault in ("ok", "http500", "http429") else 8
        if fault in ("http500", "http429"):
            status = int(fault[4:])
            if self.server.state.bump(f"{fault}:{arg}") <= n:
                self._json(status, {"error": {"message": f"injected {status}", "code": status}})
                return
            fault, n = "ok", 8
        if fault == "huge500":
            raw = b"x" * int(float(arg or 20) * 1024 * 1024)
            self.send_response(500)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)
            return
        if fault == "hang":
            time.sleep(3600)
            return
        if fault == "cut":
            # Close-delimited body: the stream ends "cleanly", only the protocol's last events are missing.
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for i in range(4):
                self.wfile.write(_chunk(f"tok{i} "))
            self.wfile.flush()
            self.close_connection = True
            return
        self._start_chunked()
        if fault == "slowloris":
            try:
                while True:
                    self._send(b": keep-alive\n\n")
                    time.sleep(0.2)
            except OSError:
                return  # the client gave up: what the test wants
        if fault == "reset":
            for i in range(4):
                self._send(_chunk(f"tok{i} "))
            self.wfile.write(b"400\r\ndata: {\"partial")  # a chunk announced, never completed
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        if fault == "malformed":
            self._send(_chunk("tok0 "))
            self._send(b'data: {"choices": [{"delta": {"content": "br\n\n')
            self._send(_chunk(finish="stop", usage={"prompt_tokens": 5, "completion_tokens": 2}))
            self._send(b"data: [DONE]\n\n")
            self._end_chunked()
            return
        if fault == "stream_error":
            self._send(_chunk("tok0 "))
            self._send(b'data: {"error": {"message": "injected engine error", "code": 500}}\n\n')
            self._end_chunked()
            return
        if fault == "huge":
            big = "y" * int(float(arg or 20) * 1024 * 1024)
            self._send(_chunk(big))
            self._send(_chunk(finish="length", usage={"prompt_tokens": 5, "completion_tokens": 1}))
            self._send(b"data: [DONE]\n\n")
            self._end_chunked()
            return
        if fault in ("stall", "gap"):
            self._stall(fault, arg, payload)
            return
        # ok
        max_tokens = int(payload.get("max_tokens") or n)
        count = min(n, max_tokens)
        for i in range(count):
            self._send(_chunk(f"tok{i} "))
        self._send(_chunk(finish="length"))
        self._send(_chunk(usage={"prompt_tokens": 5, "completion_tokens": count, "total_tokens": 5 + count}))
        self._send(b"data: [DONE]\n\n")
        self._end_chunked()


    def _stall(self, fault: str, arg: str, payload: dict[str, Any]) -> None:
        """A steady stream, except for one chosen request that stalls once (first token or a gap)."""
        which, _, seconds = arg.partition(":")
        hit = self.server.state.bump(f"{fault}:{arg}") == int(which or 1)
        count = min(16, int(payload.get("max_tokens") or 16))
        time.sleep(0.02)
        for i in range(count):
            if hit and ((fault == "stall" and i == 0) or (fault == "gap" and i == count // 2)):
                time.sleep(float(seconds or 2.0))
            self._send(_chunk(f"tok{i} "))
            time.sleep(0.01)
        self._send(_chunk(finish="length"))
        self._send(_chunk(usage={"prompt_tokens": 5, "completion_tokens": count, "total_tokens": 5 + count}))
        self._send(b"data: [DONE]\n\n")
        self._end_chunked()


class FaultHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], state: State):
        super().__init__(address, Handler)
        self.state = state


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--never-ready", action="store_true", help="/health answers 503 forever")
    p.add_argument("--fault", default="ok", help="the fault of paths without the /f/ prefix")
    p.add_argument("--model", help="ignored: the door passes the model path as it does to vLLM")
    args = p.parse_args()
    server = FaultHTTPServer((args.host, args.port), State(args.never_ready, args.fault))
    print(f"fault server listening on {args.host}:{args.port}", flush=True)
    server.serve_forever()



# ---- the faults × outcomes table the fault tests fill in ---------------------------------------
OUTCOMES: list[dict[str, str]] = []
COLUMNS = ("fault", "injected how", "engine", "recorded cause", "search / client", "leaked processes")


def record_outcome(fault: str, how: str, engine: str, cause: str, result: str, leaked: str = "0") -> None:
    """One row of the summary table (printed at the end of each fault test module)."""
    OUTCOMES.append(dict(zip(COLUMNS, (fault, how, engine, cause, result, leaked), strict=True)))


def show_table(request: Any, title: str, rows: list[dict[str, str]]) -> None:
    """Print the table past pytest's output capture, so it shows in every test run's output."""
    print_past_capture(request, f"\nfaults x outcomes ({title})\n{outcome_table(rows)}\n")


def print_past_capture(request: Any, text: str) -> None:
    """Print past pytest's output capture (`request`: a test's FixtureRequest), so that a table
    shows in every `make test` log."""
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if capture is None:
        print(text)
        return
    with capture.global_and_fixture_disabled():
        print(text, flush=True)


def outcome_table(rows: list[dict[str, str]] | None = None) -> str:
    rows = OUTCOMES if rows is None else rows
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        lines.append("| " + " | ".join(row[c].replace("|", "/").replace("\n", " ") for c in COLUMNS) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
