"""How fast can flagsearch's streaming client go? (so that we know it is never the bottleneck)

Starts a local OpenAI-compatible stand-in server (this file with --serve) that streams SSE
chunks as fast as it can, one token per chunk, pinned to one core; the client (harness.measure.client,
the same code path as every measurement) runs pinned to the other core. Prints, per concurrency:
streamed tokens/s the client handled on its one core, and the TTFT it adds (request sent ->
first content token parsed, with a server that answers at once), measured by a probe that sends
short requests one after another while the streams run.

    .venv/bin/python -m bench.client_ceiling [--tokens 2000] [--concurrency 1 4 16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time


# ---- the stand-in server: raw asyncio, HTTP/1.1 keep-alive, chunked SSE ---------------------------------
def _event(obj: dict | str) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    payload = f"data: {data}\n\n".encode()
    return f"{len(payload):x}\r\n".encode() + payload + b"\r\n"


TOKEN = _event({"id": "x", "object": "chat.completion.chunk", "model": "m",
                "choices": [{"index": 0, "delta": {"content": " tok"}, "finish_reason": None}]})


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            body = json.loads(await reader.readexactly(length)) if length else {}
            n = int(body.get("max_tokens", 16))
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            writer.write(_event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}))
            for i in range(n - 1):
                writer.write(TOKEN)
                if i % 16 == 0:
                    await writer.drain()
                    await asyncio.sleep(0)  # let other connections (the probe) be served too
            writer.write(_event({"choices": [{"index": 0, "delta": {"content": " end"}, "finish_reason": "length"}]}))
            writer.write(_event({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": n,
                                                          "total_tokens": n + 5}}))
            writer.write(_event("[DONE]") + b"0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def serve(port: int) -> None:
    async def main() -> None:
        server = await asyncio.start_server(_handle, "127.0.0.1", port, backlog=256)
        async with server:
            await server.serve_forever()
    asyncio.run(main())


# ---- the client side ---------------------------------------------------------------------------------
async def run_client(base: str, tokens: int, concurrency: int, requests_per_stream: int) -> dict[str, float]:
    """`concurrency` streams of `tokens` tokens each; meanwhile a probe sends short requests one at a
    time, whose TTFT is what the client adds to a new request while it is busy with the others."""
    import httpx

    from harness.measure.client import stream_chat

    payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens}
    probe_payload = {**payload, "max_tokens": 2}
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=concurrency * 2 + 2)) as client:
        done = asyncio.Event()

        async def stream() -> list:
            return [await stream_chat(client, base, payload, "ceiling", 120.0) for _ in range(requests_per_stream)]

        async def probe() -> list[float]:
            out: list[float] = []
            await asyncio.sleep(0.05)
            while not done.is_set() or not out:
                r = await stream_chat(client, base, probe_payload, "probe", 30.0)
                if r.ok and r.ttft_s is not None:
                    out.append(r.ttft_s)
                await asyncio.sleep(0.02)
            return out

        t0 = time.monotonic()
        probe_task = asyncio.create_task(probe())
        results = [r for rs in await asyncio.gather(*(stream() for _ in range(concurrency))) for r in rs]
        wall = time.monotonic() - t0
        done.set()
        probes = await probe_task
    bad = [r for r in results if not r.ok]
    if bad:
        raise SystemExit(f"client errors: {bad[0].error_kind}: {bad[0].error_body}")
    chunks = sum(r.content_chunks for r in results)
    return {"tok_s": chunks / wall if wall > 0 else 0.0, "us_per_tok": 1e6 * wall / chunks if chunks else 0.0,
            "ttft_ms": 1000 * statistics.median(probes)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    if args.serve:
        os.sched_setaffinity(0, {cores[-1]})
        serve(args.serve)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
    try:
        os.sched_setaffinity(0, {cores[0]})  # the client gets one core, the server the other
        base = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        asyncio.run(run_client(base, 200, 1, 1))  # warm up imports and the connection pool
        print(f"client ceiling: {args.tokens} tokens per request, one token per SSE chunk, client on core "
              f"{cores[0]}, server on core {cores[-1]}, median of {args.repeats} (min-max)")
        print(f"{'streams':>8} {'tok/s handled':>22} {'us/token':>9} {'probe TTFT (ms)':>22}")
        for c in args.concurrency:
            runs = [asyncio.run(run_client(base, args.tokens, c, 2)) for _ in range(args.repeats)]
            tok = [r["tok_s"] for r in runs]
            ttft = [r["ttft_ms"] for r in runs]
            print(f"{c:>8} {statistics.median(tok):>10.0f} ({min(tok):.0f}-{max(tok):.0f}) "
                  f"{statistics.median(r['us_per_tok'] for r in runs):>9.1f} "
                  f"{statistics.median(ttft):>10.2f} ({min(ttft):.2f}-{max(ttft):.2f})")
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
