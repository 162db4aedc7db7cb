"""CTranslate2, the peer engine, on our weights: export to BART, convert, pick its fastest CPU
thread count, and decode token ids (it takes and returns token strings)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch


def available() -> bool:
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        return False
    return True


def convert(hf: Any, tokenizer: Any, workdir: Path, *, quantization: str | None = None) -> Path:
    """Convert `hf` (a `BartForConditionalGeneration`, our weights exported) with its tokenizer;
    `quantization` as CTranslate2 spells it (`int8`, `float32`, ...; None keeps float32)."""
    from ctranslate2.converters import TransformersConverter

    # Its converter reads these BART options, which transformers 5 no longer writes.
    hf.config.normalize_before = False
    hf.config.add_final_layer_norm = False
    src, dst = workdir / "bart", workdir / f"ct2-{quantization or 'float32'}"
    if not src.is_dir():
        hf.save_pretrained(src)
        tokenizer.save_pretrained(src)
    TransformersConverter(str(src)).convert(str(dst), quantization=quantization, force=True)
    return dst


def fastest_cpu_translator(path: Path, probe: list[list[str]], *, compute_type: str = "default") -> tuple[Any, int]:
    """The peer at its best: 1 thread or as many as torch uses, whichever decodes `probe` faster.
    (On the 2-core VM, 2 threads beside torch's once ran about 10x slower than 1.) Returns the
    translator and its thread count."""
    import ctranslate2

    best: tuple[float, int, Any] | None = None
    for threads in sorted({1, torch.get_num_threads()}):
        translator = ctranslate2.Translator(str(path), device="cpu", inter_threads=1, intra_threads=threads,
                                            compute_type=compute_type)
        translator.translate_batch(probe, beam_size=1, max_decoding_length=8)  # warm-up
        t0 = time.perf_counter()
        for _ in range(3):
            translator.translate_batch(probe, beam_size=1, max_decoding_length=24)
        seconds = time.perf_counter() - t0
        if best is None or seconds < best[0]:
            best = (seconds, threads, translator)
    assert best is not None
    return best[2], best[1]


def decode_ids(translator: Any, tokenizer: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
               max_new_tokens: int, **options: Any) -> list[list[int]]:
    """Greedy token ids (up to and including EOS when it comes) for each row of a padded batch."""
    source = [tokenizer.convert_ids_to_tokens(ids[mask.bool()].tolist())
              for ids, mask in zip(input_ids.cpu(), attention_mask.cpu(), strict=True)]
    results = translator.translate_batch(source, beam_size=1, max_decoding_length=max_new_tokens,
                                         return_end_token=True, **options)
    return [tokenizer.convert_tokens_to_ids(r.hypotheses[0]) for r in results]
