"""CTranslate2, the peer engine, on our weights: export to BART, convert, pick its fastest CPU
thread count in a process of its own, and decode token ids (it takes and returns token strings)."""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from dataclasses import dataclass
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


def fastest_cpu_translator(path: Path, probe: list[list[str]], *, compute_type: str = "default"
                           ) -> tuple[TranslatorProcess, int]:
    """The peer at its best, in a process of its own (`TranslatorProcess`): 1 thread or as many as
    torch uses, whichever decodes `probe` faster. Returns the translator and its thread count."""
    translator = TranslatorProcess(path, probe, compute_type=compute_type, threads=sorted({1, torch.get_num_threads()}))
    return translator, translator.threads


REPLY_S = 1800.0  # the longest a batch of the benchmarks decodes, with room to spare


@dataclass(frozen=True)
class Result:
    """What `decode_ids` reads of a CTranslate2 result."""

    hypotheses: list[list[str]]


class TranslatorProcess:
    """A CTranslate2 `Translator` served from a spawned process: `translate_batch` as the
    translator's own (greedy: the best hypothesis only).

    Why a process: loaded into ours, CTranslate2 (its own OpenMP runtime and thread pool beside
    torch's) slowed both engines for the rest of the run, not just while it decoded. Measured on
    legal grown to 768, 8 texts, batch 1: our `ar` 2.8-2.9 s before it, 3.1-3.3 s after its first
    call, `hybrid` 1.2 s against 1.4-1.7 s, and CTranslate2 itself 2.6-2.9 s in our process
    against 2.35 s in its own; `KMP_BLOCKTIME=0` did not help. In a process of its own neither
    slowed. The pipe adds a pickle of the token strings each way, which its time includes."""

    def __init__(self, path: Path, probe: list[list[str]], *, compute_type: str, threads: list[int]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, str(path), probe, compute_type, threads), daemon=True)
        self._proc.start()
        child.close()
        self.threads: int = self._reply()

    def translate_batch(self, source: list[list[str]], **options: Any) -> list[Result]:
        self._conn.send((source, options))
        return [Result([tokens]) for tokens in self._reply()]

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):  # the child already gone, or closed before
            self._conn.send(None)
        self._proc.join(timeout=30)
        if self._proc.is_alive():
            self._proc.kill()
        self._conn.close()

    def __del__(self) -> None:  # an engine dropped frees its model's memory in the child too
        with contextlib.suppress(Exception):
            self.close()

    def _reply(self) -> Any:
        """The child's answer; a child that died or went silent for REPLY_S is an error, and the
        process is ended (a reply left unread would answer the next call)."""
        try:
            if not self._conn.poll(REPLY_S):
                raise RuntimeError(f"CTranslate2's process gave no answer in {REPLY_S:.0f} s")
            kind, value = self._conn.recv()
        except BaseException:
            self._proc.kill()
            raise
        if kind == "error":
            raise RuntimeError(f"CTranslate2's process failed: {value}")
        return value


def _serve(conn: Any, path: str, probe: list[list[str]], compute_type: str, threads: list[int]) -> None:
    """The child: pick the faster thread count on `probe`, then answer `translate_batch` calls."""
    try:
        import ctranslate2

        best: tuple[float, int, Any] | None = None
        for n in threads:
            translator = ctranslate2.Translator(path, device="cpu", inter_threads=1, intra_threads=n,
                                                compute_type=compute_type)
            translator.translate_batch(probe, beam_size=1, max_decoding_length=8)  # warm-up
            t0 = time.perf_counter()
            for _ in range(3):
                translator.translate_batch(probe, beam_size=1, max_decoding_length=24)
            seconds = time.perf_counter() - t0
            if best is None or seconds < best[0]:
                best = (seconds, n, translator)
        assert best is not None
        conn.send(("ok", best[1]))
        while (msg := conn.recv()) is not None:
            source, options = msg
            results = best[2].translate_batch(source, **options)
            conn.send(("ok", [r.hypotheses[0] for r in results]))
    except Exception as exc:  # the parent raises it, named
        with contextlib.suppress(OSError):  # unless the parent is gone
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


def decode_ids(translator: Any, tokenizer: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
               max_new_tokens: int, **options: Any) -> list[list[int]]:
    """Greedy token ids (up to and including EOS when it comes) for each row of a padded batch."""
    source = [tokenizer.convert_ids_to_tokens(ids[mask.bool()].tolist())
              for ids, mask in zip(input_ids.cpu(), attention_mask.cpu(), strict=True)]
    results = translator.translate_batch(source, beam_size=1, max_decoding_length=max_new_tokens,
                                         return_end_token=True, **options)
    return [tokenizer.convert_tokens_to_ids(r.hypotheses[0]) for r in results]
