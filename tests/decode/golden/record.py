"""Re-record the `base/*` entries of decode_v1.json.gz with the pre-engine loops.

Run from a checkout of commit d66e891 (the last one with `_generate_ar` and
`speculative_generate`), pointing at this tree's checkpoint and data:

    git worktree add /tmp/old d66e891
    cd /tmp/old && PYTHONPATH=/tmp/old /work/main/.venv/bin/python /work/main/tests/decode/golden/record.py /work/main

The `tiny/*` entries (a random model) do not depend on the shipped checkpoint and are kept.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

# The names of commit d66e891's tree, which PYTHONPATH puts first.
from yue2_jobs.model.data import read_split
from yue2_jobs.model.generation import generate

from yue2_jobs.model.checkpoint import load_checkpoint


def batches_of(ids, mask, size: int):
    """tests.tiny_models.batches_of, which the old tree lacks."""
    for i in range(0, ids.shape[0], size):
        width = int(mask[i : i + size].sum(1).max())
        yield ids[i : i + size, :width], mask[i : i + size, :width]


MODES = {"ar": {"mode": "ar"}, "hybrid": {"mode": "hybrid"},
         "hybrid_fast@0.6": {"mode": "hybrid_fast", "nar_threshold": 0.6},
         "hybrid_fast@0.9": {"mode": "hybrid_fast", "nar_threshold": 0.9}, "prompt_lookup": {"mode": "prompt_lookup"}}


def main(root: Path) -> None:
    golden_path = root / "tests" / "decode" / "golden" / "decode_v1.json.gz"
    golden = json.loads(gzip.open(golden_path, "rt").read())
    model, tok = load_checkpoint(root / "checkpoints" / "base")
    texts = [r["text"] for r in read_split(root / "data", "general", "eval")[:160]]
    texts += [r["text"] for r in read_split(root / "data", "legal", "eval")[:48]]
    enc = tok(texts, truncation=True, max_length=128, padding=True, return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    for mode, kw in MODES.items():
        for batch_size, max_new in ((1, 48), (3, 48), (16, 48), (16, 1)):
            rows = []
            for b_ids, b_mask in batches_of(ids, mask, batch_size):
                out = generate(model, input_ids=b_ids, attention_mask=b_mask, max_new_tokens=max_new,
                               return_dict_in_generate=True, **kw)
                for seq, st in zip(out.sequences.tolist(), out.stats, strict=True):
                    rows.append([seq[1 : 1 + st.tokens], st.decoder_steps])
            golden[f"base/{mode}/b{batch_size}/n{max_new}"] = rows
            print(mode, batch_size, max_new, flush=True)
    with gzip.GzipFile(golden_path, "wb", mtime=0) as f:
        f.write(json.dumps(golden, sort_keys=True).encode())


if __name__ == "__main__":
    main(Path(sys.argv[1]))
