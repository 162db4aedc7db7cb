"""Every storage key the pipeline writes or reads, in one place.

Keys are deterministic, so a retried or redone write lands on the same object:

    {tenant}/files/{file_id}.jsonl          an uploaded batch input file
    {tenant}/jobs/{job_id}.input.txt        a single job's input, when too large for its row
    {file key}#{start}-{end}                one line of a batch input file (byte range)
    {tenant}/{batch_id|jobs}/{job_id}.json  a job's output JSON
    {output key minus .json}.{svg|png}      a render job's images, beside its JSON
    {tenant}/{batch_id}/{output|error}.jsonl  a finished batch's result files
"""

from __future__ import annotations


def upload_key(*, tenant: str, file_id: str) -> str:
    return f"{tenant}/files/{file_id}.jsonl"


def own_input_key(*, tenant: str, job_id: str) -> str:
    return f"{tenant}/jobs/{job_id}.input.txt"


def line_ref(file_key: str, start: int, end: int) -> str:
    """A reference to bytes [start, end) of `file_key`: one line of a batch input file."""
    return f"{file_key}#{start}-{end}"


def parse_line_ref(ref: str) -> tuple[str, tuple[int, int] | None]:
    """(key, byte range) of an input reference; no range for a whole object."""
    key, sep, span = ref.rpartition("#")
    if not sep:
        return ref, None
    start, end = (int(x) for x in span.split("-"))
    return key, (start, end)


def output_key(*, tenant: str, batch_id: str | None, job_id: str) -> str:
    return f"{tenant}/{batch_id or 'jobs'}/{job_id}.json"


def file_key(json_key: str, suffix: str) -> str:
    """Where a job's extra output file (a render's `svg` or `png`) lives, beside its JSON."""
    return f"{json_key.removesuffix('.json')}.{suffix}"


def batch_result_key(*, tenant: str, batch_id: str, name: str) -> str:
    """`name` is `output` or `error`."""
    return f"{tenant}/{batch_id}/{name}.jsonl"


def batch_result_file_id(batch_id: str, name: str) -> str:
    return f"file-{batch_id.removeprefix('batch_')}-{name}"
