"""The official `openai` client against yue2-jobs, as a user coming from OpenAI Batch writes it:
list and auto-paginate batches, list and delete files, create a batch twice under one
Idempotency-Key (one batch results), and receive a signed `batch.completed` webhook, verified
with the client's own Standard Webhooks check.

    python tests/openai_batch_script.py --base-url http://127.0.0.1:8000/v1 --api-key yk-... [--batches 250]

It prints one JSON object of what it saw; tests/pipeline/test_openai_client.py runs it.
"""

from __future__ import annotations

import argparse
import io
import json
import queue
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from openai import OpenAI


def receiver() -> tuple[ThreadingHTTPServer, queue.Queue[tuple[dict[str, str], bytes]]]:
    got: queue.Queue[tuple[dict[str, str], bytes]] = queue.Queue()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            got.put((dict(self.headers.items()), self.rfile.read(int(self.headers["content-length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, got


def line(custom_id: str, text: str) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/summarize", "body": {"input": text}}


def upload(client: OpenAI, lines: list[dict[str, Any]]) -> str:
    data = "".join(json.dumps(x) + "\n" for x in lines).encode()
    return client.files.create(file=("requests.jsonl", io.BytesIO(data)), purpose="batch").id


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--batches", type=int, default=250)
    args = parser.parse_args()
    client = OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0)
    seen: dict[str, Any] = {}

    server, got = receiver()
    hook = client.webhooks.create(url=f"http://127.0.0.1:{server.server_address[1]}/openai-hook",
                                  event_types=["batch.completed"], name="script receiver")
    file_id = upload(client, [line("a", "a short text to summarise")])
    made = {client.batches.create(input_file_id=file_id, endpoint="/v1/summarize", completion_window="24h").id
            for _ in range(args.batches)}
    listed = [b.id for b in client.batches.list(limit=100)]  # auto-pagination: `after` and `has_more`
    seen["batches_made"], seen["batches_listed"] = len(made), len(listed)
    seen["listed_each_once"] = len(set(listed)) == len(listed) and made <= set(listed)

    spare = upload(client, [line("b", "a file to delete")])
    seen["files_listed"] = len([f.id for f in client.files.list(purpose="batch")])
    seen["file_deleted"] = client.files.delete(spare).deleted
    seen["deleted_file_listed"] = spare in {f.id for f in client.files.list(purpose="batch")}

    key = {"Idempotency-Key": "script-nightly-1"}
    bad_file = upload(client, [line("x", "")])  # its only line is invalid: the batch completes at once
    first = client.batches.create(input_file_id=bad_file, endpoint="/v1/summarize", completion_window="24h",
                                  extra_headers=key)
    second = client.batches.create(input_file_id=bad_file, endpoint="/v1/summarize", completion_window="24h",
                                   extra_headers=key)
    seen["idempotent_same_batch"] = first.id == second.id
    seen["batches_after_retry"] = len(list(client.batches.list(limit=100)))

    headers, body = got.get(timeout=60)
    event = client.webhooks.unwrap(body, headers, secret=hook.signing_secret)  # raises on a bad signature
    seen["webhook_type"], seen["webhook_batch"] = event.type, event.data.id
    seen["webhook_for_first"] = event.data.id == first.id
    client.webhooks.delete(hook.id)
    server.shutdown()
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
