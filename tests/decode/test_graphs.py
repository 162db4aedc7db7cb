"""The graph-replay plumbing, run on the CPU with a plain call standing in for each graph replay.

Everything in `graphs.py` but `torch.cuda.CUDAGraph` itself runs here: the per-bucket static
buffers at the model's full lengths, copying a working set in and out, idle padding rows, the full
static attention span, and both decode loops replaying instead of stepping.
"""

from __future__ import annotations

import pytest
import torch

from tests.tiny_models import generate, random_inputs, session_of
from yue2_jobs.decode.engine import StepShape
from yue2_jobs.decode.graphs import StepGraphs, graphed
from yue2_jobs.decode.params import DecodingParams
from yue2_jobs.decode.requests import DecodeRequest
from yue2_jobs.decode.session import DecodeSession


@pytest.fixture
def replaying(tiny_yue2):
    graphs = session_of(tiny_yue2).capture_graphs(max_rows=6, use_graphs=False)
    yield graphs
    session_of(tiny_yue2).steps.graphs = {}


def test_capture_makes_one_step_per_bucket_and_shape(tiny_yue2, replaying):
    assert [g.sizes for g in replaying] == [(1, 2, 4, 6)] * 2
    assert [g.shape.width for g in replaying] == [1, 1 + tiny_yue2.config.nar_block_size]
    assert sum(g.count for g in replaying) == 8 and all(g.capture_s >= 0 for g in replaying)
    steps = session_of(tiny_yue2).steps
    assert steps.captured(StepShape.of(k=tiny_yue2.config.nar_block_size, drafts="nar")) is replaying[1]


@pytest.mark.parametrize("mode", ["ar", "hybrid"])
def test_generate_through_the_buckets_equals_eager(tiny_yue2, tiny_config, mode):
    ids, mask = random_inputs(40, tiny_config.vocab_size, seed=11)
    eager = [generate(tiny_yue2, input_ids=ids[i : i + 5], attention_mask=mask[i : i + 5], mode=mode,
                      max_new_tokens=16) for i in range(0, 40, 5)]
    session_of(tiny_yue2).capture_graphs(max_rows=6, use_graphs=False)
    try:
        calls = []
        graphs = session_of(tiny_yue2).steps.captured(StepShape.of(k=tiny_config.nar_block_size,
                                                                   drafts="none" if mode == "ar" else "nar"))
        bucket = graphs.buckets[6]
        replay = bucket.replay
        bucket.replay = lambda: (calls.append(1), replay())[1]
        for i in range(0, 40, 5):
            got = generate(tiny_yue2, input_ids=ids[i : i + 5], attention_mask=mask[i : i + 5], mode=mode,
                           max_new_tokens=16)
            assert torch.equal(got, eager[i // 5])
        assert calls  # five rows ran in the bucket of six
    finally:
        session_of(tiny_yue2).steps.graphs = {}


def test_the_engine_replays_too_and_too_many_rows_step_eagerly(tiny_yue2, tiny_config, replaying):
    ids, mask = random_inputs(20, tiny_config.vocab_size, seed=12)
    inputs = [row[m.bool()].tolist() for row, m in zip(ids, mask, strict=True)]
    expected = generate(tiny_yue2, input_ids=ids, attention_mask=mask, mode="ar", max_new_tokens=12)
    for max_rows in (4, 9):  # 9 rows exceed the largest bucket (6): those steps run eagerly
        engine = session_of(tiny_yue2).engine(max_rows=max_rows)
        results = engine.run([DecodeRequest(key=i, input_ids=x, params=DecodingParams(mode="hybrid", max_new_tokens=12))
                              for i, x in enumerate(inputs)])
        for res, row in zip(results, expected.tolist(), strict=True):
            body = row[1:]
            end = body.index(tiny_config.eos_token_id) + 1 if tiny_config.eos_token_id in body else 12
            assert res.error is None and res.tokens == body[:end]


def test_sampling_is_not_captured(tiny_yue2):
    from yue2_jobs.decode.sampling import SamplingParams

    sampled = SamplingParams.of(DecodingParams(do_sample=True))
    with pytest.raises(ValueError, match="greedy"):
        StepGraphs(tiny_yue2, shape=StepShape.of(k=3, drafts="nar", params=sampled), buckets=(1,))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_replay_equals_eager(tiny_yue2, tiny_config):  # pragma: no cover - GPU only
    session = DecodeSession(tiny_yue2, device="cuda")  # moves the shared model: moved back below
    try:
        ids, mask = random_inputs(8, tiny_config.vocab_size, seed=13)
        eager = session.generate(ids, mask, mode="hybrid", max_new_tokens=16).sequences
        session.capture_graphs(max_rows=8)
        assert torch.equal(session.generate(ids, mask, mode="hybrid", max_new_tokens=16).sequences, eager)
        assert callable(graphed)
    finally:
        tiny_yue2.to("cpu")
