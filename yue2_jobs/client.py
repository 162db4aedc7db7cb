"""Python client of the HTTP API (what the CLI uses); the `openai` client works against it too."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from yue2_jobs.core.config import normalize_api_url
from yue2_jobs.errors import PipelineError

TERMINAL_JOB = {"succeeded", "failed", "cancelled"}
TERMINAL_BATCH = {"completed", "failed", "expired", "cancelled"}


class ApiError(PipelineError):
    """Raised when the API answers with an error; carries its status and message."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.param = status, param


RETRIES_429 = 5  # a 429 (the tenant's requests in flight at the API's limit) is sent again this often
MAX_RETRY_AFTER_S = 30.0


class _RetryTooMany(httpx.BaseTransport):
    """Sends a request again after a 429's `Retry-After`, up to RETRIES_429 times, as OpenAI's
    client does: the API answers 429 at once when the tenant has its limit of requests in flight,
    rather than queueing them, so a client that waits and retries gets through."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner = inner

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.read()  # the body in memory, to send again (uploads are read whole already)
        for _ in range(RETRIES_429):
            response = self.inner.handle_request(request)
            if response.status_code != 429:
                return response
            response.close()
            time.sleep(_retry_after_s(response))
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


def _retry_after_s(response: httpx.Response) -> float:
    """The response's `Retry-After` in seconds (1 when absent or not a number), at most MAX_RETRY_AFTER_S."""
    try:
        return min(max(float(response.headers.get("Retry-After", "1")), 0.0), MAX_RETRY_AFTER_S)
    except ValueError:
        return 1.0


class Client:
    def __init__(self, base_url: str, api_key: str, *, timeout: float = 60.0) -> None:
        """`base_url`: the API's URL, with or without /v1 (`normalize_api_url`)."""
        self.base_url = normalize_api_url(base_url, setting="base_url")
        self.http = httpx.Client(base_url=self.base_url, timeout=timeout,
                                 headers={"Authorization": f"Bearer {api_key}"},
                                 transport=_RetryTooMany(httpx.HTTPTransport()))

    def _json(self, response: httpx.Response) -> Any:
        if response.status_code >= 400:
            try:
                err = response.json()["error"]
                raise ApiError(response.status_code, err["message"], err.get("param"))
            except (ValueError, KeyError, TypeError):
                # Not the API's error shape: something else answers at this URL; say which URL.
                raise ApiError(response.status_code, f"{response.text[:300]} (from {response.request.method} "
                               f"{response.request.url}; is the yue2 API at {self.base_url}?)") from None
        return response.json()

    def submit_job(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._json(self.http.post("/v1/jobs", json=body))

    def job(self, job_id: str) -> dict[str, Any]:
        return self._json(self.http.get(f"/v1/jobs/{job_id}"))

    def cancel(self, object_id: str) -> dict[str, Any]:
        kind = "batches" if object_id.startswith("batch_") else "jobs"
        return self._json(self.http.post(f"/v1/{kind}/{object_id}/cancel"))

    def upload(self, path: str | Path, *, progress: Callable[[int], None] | None = None) -> dict[str, Any]:
        data = Path(path).read_bytes()
        response = self.http.post("/v1/files", data={"purpose": "batch"},
                                  files={"file": (Path(path).name, data, "application/jsonl")})
        if progress:
            progress(len(data))
        return self._json(response)

    def create_batch(self, input_file_id: str, *, endpoint: str = "/v1/summarize",
                     metadata: dict[str, str] | None = None, experiment_id: str | None = None) -> dict[str, Any]:
        return self._json(self.http.post("/v1/batches", json={"input_file_id": input_file_id, "endpoint": endpoint,
                                                              "completion_window": "24h", "metadata": metadata,
                                                              "experiment_id": experiment_id}))

    def retry_failed(self, batch_id: str) -> dict[str, Any]:
        """A new batch of an ended batch's lines without a result, `metadata.retry_of` naming it."""
        return self._json(self.http.post(f"/v1/batches/{batch_id}/retry_failed"))

    def create_experiment(self, *, variants: list[dict[str, Any]], mode: str = "split", name: str = ""
                          ) -> dict[str, Any]:
        return self._json(self.http.post("/v1/experiments", json={"name": name, "mode": mode, "variants": variants}))

    def experiment_report(self, experiment_id: str) -> dict[str, Any]:
        return self._json(self.http.get(f"/v1/experiments/{experiment_id}/report"))

    def experiment_report_html(self, experiment_id: str) -> str:
        response = self.http.get(f"/v1/experiments/{experiment_id}/report", params={"format": "html"})
        if response.status_code >= 400:
            self._json(response)
        return response.text

    def batch(self, batch_id: str) -> dict[str, Any]:
        return self._json(self.http.get(f"/v1/batches/{batch_id}"))

    def status(self, object_id: str) -> dict[str, Any]:
        return self.batch(object_id) if object_id.startswith("batch_") else self.job(object_id)

    def job_file(self, job_id: str, suffix: str) -> bytes:
        """A render job's `svg` or `png`."""
        response = self.http.get(f"/v1/jobs/{job_id}/files/{suffix}")
        if response.status_code >= 400:
            self._json(response)
        return response.content

    def file_content(self, file_id: str) -> bytes:
        response = self.http.get(f"/v1/files/{file_id}/content")
        if response.status_code >= 400:
            self._json(response)
        return response.content

    def wait(self, object_id: str, *, poll_s: float = 0.5, timeout_s: float | None = None,
             on_update: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Poll until the job or batch is terminal; `on_update` sees every poll's answer."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        terminal = TERMINAL_BATCH if object_id.startswith("batch_") else TERMINAL_JOB
        while True:
            state = self.status(object_id)
            if on_update:
                on_update(state)
            if state["status"] in terminal:
                return state
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{object_id} still {state['status']} after {timeout_s}s")
            time.sleep(poll_s)
