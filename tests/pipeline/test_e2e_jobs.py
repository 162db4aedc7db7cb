"""End to end, single jobs: decoding modes against direct calls, long inputs and repetition controls,
the `yue2` CLI."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from tests.pipeline.conftest import ROOT, new_key, wait_for
from tests.pipeline.e2e_helpers import (
    check_outputs,
    direct_summaries,
    result_lines,
    submit,
    wait_batch,
    write_batch,
)
from tests.shipped import shipped_base
from yue2_jobs.client import Client


def test_single_jobs_generate_and_modes_equal_direct_calls(client: Client, workers: Any, eval_texts: list[str]
                                                           ) -> None:
    import torch

    from yue2_jobs.decode.session import DecodeSession


    text = eval_texts[3]
    worker = workers()
    jobs = {
        "ar": client.submit_job({"input": text, "mode": "ar"}),
        "hybrid": client.submit_job({"input": text, "mode": "hybrid"}),
        "auto": client.submit_job({"input": text}),  # the default mode
        "sampled": client.submit_job({"kind": "generate", "prompt": text, "do_sample": True, "seed": 7,
                                      "temperature": 0.8, "max_new_tokens": 20, "mode": "ar"}),
    }
    done = {k: wait_for(lambda j=j: (s := client.job(j["id"]))["status"] in ("succeeded", "failed") and s,
                        timeout=120, what=f"{k} job") for k, j in jobs.items()}
    assert {s["status"] for s in done.values()} == {"succeeded"}, (done, worker.tail())
    assert done["ar"]["output"] == done["hybrid"]["output"] == done["auto"]["output"] == direct_summaries((text,))[text]
    assert done["hybrid"]["params"]["mode"] == "hybrid" and done["hybrid"]["decoding"]["tau"] >= 1.0
    # Each job records the mode it ran: `auto` resolves to one of the two lossless modes.
    assert (done["ar"]["decoding"]["mode"], done["hybrid"]["decoding"]["mode"]) == ("ar", "hybrid")
    assert done["auto"]["params"]["mode"] == "auto" and done["auto"]["decoding"]["mode"] in ("ar", "hybrid")
    model, tokenizer = shipped_base()
    enc = tokenizer([text], truncation=True, max_length=tokenizer.model_max_length, return_tensors="pt")
    with torch.inference_mode():
        seq = DecodeSession(model).generate(enc["input_ids"], enc["attention_mask"], mode="ar", do_sample=True, seed=7,
                             temperature=0.8, max_new_tokens=20)
    assert done["sampled"]["output"] == tokenizer.decode(seq.sequences[0], skip_special_tokens=True).strip()
    assert done["sampled"]["kind"] == "generate"


def test_long_inputs_and_repetition_controls_through_the_pipeline(client: Client, workers: Any, eval_texts: list[str],
                                                                  tmp_path: Path) -> None:
    """long_input truncate / reject / chunk and the repetition controls, as single jobs and as
    batch lines: a rejected line fails alone, the others record what happened to their input."""
    import torch

    from yue2_jobs.decode.session import DecodeSession


    long_text = ""
    for text in eval_texts * 4:
        long_text += (" " if long_text else "") + text
        if len(long_text.split()) >= 3000:
            break
    assert len(long_text.split()) >= 3000
    worker = workers()
    jobs = {name: client.submit_job({"input": long_text, "long_input": name}) for name in ("reject", "chunk")}
    jobs["default"] = client.submit_job({"input": long_text})
    jobs["controls"] = client.submit_job({"input": eval_texts[5], "mode": "hybrid", "no_repeat_ngram_size": 2,
                                          "repetition_penalty": 1.3})
    done = {k: wait_for(lambda j=j: (s := client.job(j["id"]))["status"] in ("succeeded", "failed") and s,
                        timeout=300, what=f"{k} job") for k, j in jobs.items()}
    model, tokenizer = shipped_base()
    limit, n_tokens = tokenizer.model_max_length, len(tokenizer(long_text, verbose=False)["input_ids"])
    assert done["default"]["status"] == "succeeded" and done["default"]["params"]["long_input"] == "truncate"
    assert done["default"]["input_truncated"] is True
    usage = done["default"]["usage"]
    assert (usage["input_tokens"], usage["input_tokens_used"]) == (n_tokens, limit)
    rejected = done["reject"]
    assert rejected["status"] == "failed" and rejected["error"]["code"] == "input_too_long", rejected
    assert f"{n_tokens:,} tokens, over the limit of {limit:,} tokens" in rejected["error"]["message"]
    chunked = done["chunk"]
    assert chunked["status"] == "succeeded" and chunked["output"], (chunked, worker.tail())
    assert chunked["decoding"]["chunks"] > 5 and chunked["input_truncated"] is False
    assert chunked["decoding"]["decoder_steps"] > chunked["decoding"]["chunks"]
    enc = tokenizer([eval_texts[5]], return_tensors="pt")
    with torch.inference_mode():
        seq = DecodeSession(model).generate(enc["input_ids"], enc["attention_mask"], mode="ar", no_repeat_ngram_size=2,
                             repetition_penalty=1.3, max_new_tokens=done["controls"]["params"]["max_new_tokens"])
    assert done["controls"]["output"] == tokenizer.decode(seq.sequences[0], skip_special_tokens=True).strip()

    path = tmp_path / "long.jsonl"
    lines = [{"custom_id": c, "method": "POST", "url": "/v1/summarize", "body": {"input": t, **extra}}
             for c, t, extra in (("short", eval_texts[0], {}), ("cut", long_text, {}),
                                 ("refused", long_text, {"long_input": "reject"}))]
    path.write_text("".join(json.dumps(ln) + "\n" for ln in lines))
    state = wait_batch(client, submit(client, path), timeout=300, worker=worker)
    assert state["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    out = {ln["custom_id"]: ln["response"]["body"] for ln in result_lines(client, state["output_file_id"])}
    assert (out["short"]["input_truncated"], out["cut"]["input_truncated"]) == (False, True)
    assert out["cut"]["usage"] == {"input_tokens": n_tokens, "input_tokens_used": limit,
                                   "output_tokens": out["cut"]["usage"]["output_tokens"]}
    errors = result_lines(client, state["error_file_id"])
    assert [e["custom_id"] for e in errors] == ["refused"] and "input_too_long" in json.dumps(errors[0])


def test_cli_submit_wait_results_cancel(api: Any, settings: Any, workers: Any, eval_texts: list[str],
                                        tmp_path: Path) -> None:
    import subprocess
    import sys

    key = new_key(settings, f"t-{uuid.uuid4().hex[:8]}")
    env = {**__import__("os").environ, "YUE2_API_URL": api.url, "YUE2_API_KEY": key}

    def yue2(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "yue2_jobs", *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300)

    by_custom_id = write_batch(tmp_path / "in.jsonl", eval_texts[:10])
    submitted = yue2("submit", str(tmp_path / "in.jsonl"))
    assert submitted.returncode == 0, submitted.stderr
    batch_id = submitted.stdout.strip()
    assert batch_id.startswith("batch_") and "upload" in submitted.stderr
    assert json.loads(yue2("status", batch_id).stdout)["request_counts"]["total"] == 10
    worker = workers()
    waited = yue2("wait", batch_id, "--poll", "0.2")
    assert waited.returncode == 0, waited.stderr + worker.tail()
    assert json.loads(waited.stdout)["status"] == "completed" and "10/10" in waited.stderr
    assert yue2("results", batch_id, "-o", str(tmp_path / "out.jsonl")).returncode == 0
    check_outputs([json.loads(ln) for ln in (tmp_path / "out.jsonl").read_text().splitlines()], by_custom_id)
    cancelled = yue2("cancel", batch_id)
    assert cancelled.returncode == 2 and "409" in cancelled.stderr
