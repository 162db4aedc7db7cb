"""An open-loop HTTP/1.1 GET load generator on raw asyncio streams, run as its own process.

httpx costs about a millisecond of CPU per request here, which on a 2-core machine would compete
with the API it measures; this sends pipelined-free keep-alive requests over --connections
sockets at --rps, each request's latency timed from its scheduled send time (so a stalled server
shows up as latency, not as a slower request rate), and prints the latencies as JSON.

    python benchmarks/loadgen.py --url http://127.0.0.1:8000 --key KEY --ids ids.txt --rps 200 --seconds 30
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from urllib.parse import urlparse


async def worker(host: str, port: int, key: str, queue: asyncio.Queue[tuple[float, str] | None],
                 latencies: list[float], errors: list[str]) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    while (item := await queue.get()) is not None:
        scheduled, path = item
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n\r\n".encode())
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        await reader.readexactly(length)
        latencies.append(time.perf_counter() - scheduled)
        if status != 200:
            errors.append(f"HTTP {status} for {path}")
    writer.close()


async def run(url: str, key: str, paths: list[str], *, rps: float, seconds: float, connections: int,
              stop_file: str | None) -> dict[str, object]:
    parsed = urlparse(url)
    queue: asyncio.Queue[tuple[float, str] | None] = asyncio.Queue()
    latencies: list[float] = []
    errors: list[str] = []
    tasks = [asyncio.create_task(worker(parsed.hostname or "127.0.0.1", parsed.port or 80, key, queue, latencies,
                                        errors)) for _ in range(connections)]
    t0 = time.perf_counter()
    i = 0
    import os

    while time.perf_counter() - t0 < seconds and not (stop_file and os.path.exists(stop_file)):
        due = t0 + i / rps
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        queue.put_nowait((due, random.choice(paths)))
        i += 1
    sent_s = time.perf_counter() - t0
    for _ in tasks:
        queue.put_nowait(None)
    await asyncio.gather(*tasks)
    return {"sent": i, "sent_s": sent_s, "latencies": latencies, "errors": errors[:10], "error_count": len(errors)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--ids", required=True, help="file of job ids, one per line")
    parser.add_argument("--rps", type=float, default=200)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--stop-file", default=None, help="stop early once this file exists")
    args = parser.parse_args()
    with open(args.ids) as f:
        paths = [f"/v1/jobs/{line.strip()}" for line in f if line.strip()]
    result = asyncio.run(run(args.url, args.key, paths, rps=args.rps, seconds=args.seconds,
                             connections=args.connections, stop_file=args.stop_file))
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
