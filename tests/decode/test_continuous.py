"""The continuous-batching engine: same tokens as `generate` row by row, slots refilled at once,
row and token bounds, out-of-memory splitting, bad requests failing alone."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from tests.shipped import shipped_base
from tests.tiny_models import generate, session_of
from yue2_jobs.decode.params import DecodingParams
from yue2_jobs.decode.requests import DecodeRequest
from yue2_jobs.training.data import read_split

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def shipped():
    model, tok = shipped_base()
    rows = read_split(ROOT / "data", "general", "eval")[:20]
    ids = tok([r["text"] for r in rows], truncation=True, max_length=128)["input_ids"]
    return model, ids


def request(key, input_ids: list[int], max_new_tokens: int, mode: str = "hybrid",
            min_new_tokens: int = 0) -> DecodeRequest:
    return DecodeRequest(key=key, input_ids=input_ids, min_new_tokens=min_new_tokens,
                         params=DecodingParams(mode=mode, max_new_tokens=max_new_tokens))


def requests(ids: list[list[int]], seed: int = 0) -> list[DecodeRequest]:
    rng = random.Random(seed)
    return [request(i, x, max_new_tokens=rng.randint(3, 40), mode=rng.choice(["ar", "hybrid"]))
            for i, x in enumerate(ids)]


def engine(model, **kwargs):
    return session_of(model).engine(**kwargs)


def alone(model, req: DecodeRequest) -> list[int]:
    out = generate(model, input_ids=torch.tensor([req.input_ids]), params=req.params)
    return [t for t in out[0, 1:].tolist() if t != model.config.pad_token_id]


@pytest.mark.parametrize("policy", ["continuous", "static"])
def test_same_tokens_as_generate_alone(shipped, policy: str) -> None:
    model, ids = shipped
    reqs = requests(ids)
    eng = engine(model, max_rows=4, policy=policy)
    results = eng.run(reqs)
    assert all(r.error is None for r in results)
    for req, res in zip(reqs, results, strict=True):
        assert res.tokens == alone(model, req), req.key
        assert res.stats is not None and res.stats.tokens == len(res.tokens)
        if req.params.mode == "ar":
            assert res.stats.nar_tokens == 0 and res.stats.decoder_steps == len(res.tokens)
    assert not eng.has_work() and eng.ws.slots == []


def test_a_finished_row_is_refilled_at_the_next_step(shipped) -> None:
    model, ids = shipped
    reqs = [request(i, input_ids=ids[i], max_new_tokens=n, min_new_tokens=n, mode="ar")
            for i, n in enumerate([3, 30, 30, 3])]
    eng = engine(model, max_rows=2)
    eng.submit(reqs)
    finished_at: dict[int, int] = {}
    admitted_at: dict[int, int] = {}
    for step in range(200):
        for r in eng.step():
            finished_at[r.request.key] = step
            assert len(r.tokens) == r.request.params.max_new_tokens  # min_new_tokens = max: exact lengths
        for slot in eng.ws.live_slots():
            admitted_at.setdefault(slot.request.key, step)
        assert eng.live <= 2
        if not eng.has_work():
            break
    assert admitted_at[0] == admitted_at[1] == 0
    assert admitted_at[2] == finished_at[0] + 1  # took request 0's slot at once
    assert admitted_at[3] == finished_at[1] + 1
    # The static policy waits for the whole batch: request 2 starts only after request 1 is done.
    static = engine(model, max_rows=2, policy="static")
    static.run([request(r.key, r.input_ids, max_new_tokens=r.params.max_new_tokens,
                        min_new_tokens=r.min_new_tokens, mode="ar") for r in reqs])
    assert static.counters.steps == 30 + 30  # two batches, each as long as its longest row
    assert eng.counters.steps == 3 + 30  # one slot ran 3 then 30 tokens, the other 30 then 3


def test_token_bound_limits_admission_and_never_starves(shipped) -> None:
    model, ids = shipped
    reqs = requests(ids)
    budget = max(len(r.input_ids) + 1 + r.params.max_new_tokens for r in reqs) + 20
    eng = engine(model, max_rows=8, max_tokens=budget)
    eng.submit(reqs)
    got = {}
    while eng.has_work():
        for r in eng.step():
            got[r.request.key] = r
        reserved = sum(len(s.request.input_ids) + 1 + s.request.params.max_new_tokens for s in eng.ws.live_slots())
        assert reserved <= budget
    assert sorted(got) == list(range(len(reqs))) and all(r.error is None for r in got.values())
    for req in reqs:
        assert got[req.key].tokens == alone(model, req)


def test_out_of_memory_splits_the_batch_and_no_job_fails(shipped, monkeypatch: pytest.MonkeyPatch) -> None:
    model, ids = shipped
    reqs = requests(ids, seed=1)
    real = model.decode_block

    def small_device(tokens, *args, **kwargs):
        if tokens.shape[0] > 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(tokens, *args, **kwargs)

    monkeypatch.setattr(model, "decode_block", small_device)
    eng = engine(model, max_rows=8)
    results = eng.run(reqs)
    monkeypatch.undo()
    assert all(r.error is None for r in results)
    assert eng.counters.oom_events >= 1 and eng.counters.preempted >= 1 and eng.row_cap <= 3
    for req, res in zip(reqs, results, strict=True):
        assert res.tokens == alone(model, req), req.key


def test_a_row_that_never_fits_fails_alone(shipped, monkeypatch: pytest.MonkeyPatch) -> None:
    model, ids = shipped
    reqs = requests(ids[:6], seed=2)
    eng = engine(model, max_rows=6)
    real = model.decode_block

    def huge_row(tokens, *args, **kwargs):
        if any(s.request.key == 4 for s in eng.ws.live_slots()):
            raise torch.OutOfMemoryError("CUDA out of memory")
        return real(tokens, *args, **kwargs)

    monkeypatch.setattr(model, "decode_block", huge_row)
    results = eng.run(reqs)
    monkeypatch.undo()
    assert [r.request.key for r in results if r.error is not None] == [4]
    assert isinstance(results[4].error, torch.OutOfMemoryError) and not results[4].isolate
    for req, res in zip(reqs, results, strict=True):
        if req.key != 4:
            assert res.tokens == alone(model, req)


def test_bad_requests_fail_alone_and_other_errors_ask_for_isolation(shipped, monkeypatch) -> None:
    model, ids = shipped
    good = request("ok", ids[0], max_new_tokens=8)
    bad = [request("mode", input_ids=ids[1], max_new_tokens=8, mode="nar"),
           request("long", input_ids=ids[1], max_new_tokens=10_000),
           request("empty", input_ids=[], max_new_tokens=8),
           request("min", input_ids=ids[1], max_new_tokens=8, min_new_tokens=9)]
    eng = engine(model, max_rows=4)
    results = {r.request.key: r for r in eng.run([good, *bad])}
    assert results["ok"].error is None and results["ok"].tokens == alone(model, good)
    assert "mode must be one of" in str(results["mode"].error)
    assert "max_new_tokens must be between 1 and 319" in str(results["long"].error)
    assert "input must have 1 to 320 tokens" in str(results["empty"].error)
    assert "min_new_tokens must be between 0 and max_new_tokens (8)" in str(results["min"].error)

    def broken(*args, **kwargs):
        raise RuntimeError("a kernel failed")

    monkeypatch.setattr(model, "decode_block", broken)
    out = eng.run([request(i, input_ids=ids[i], max_new_tokens=8) for i in range(3)])
    assert all(r.isolate and "kernel failed" in str(r.error) for r in out)
    assert not eng.has_work()
