"""Continuous batching: in-flight sequences share decoder steps, and a finished row's slot is
refilled from the waiting queue at the next step instead of idling until the batch's longest
row is done (Orca-style iteration-level scheduling).

`ContinuousBatcher` (built by `DecodeSession.engine`) schedules a working set of rows (slots,
`working_set.py`). Each `step()`:

1. admits waiting requests into free slots (encoder pass for the newcomers only; their
   cross-attention K/V are written into the slot, the self-attention cache needs no reset
   because a query never sees a position past its own), within `max_rows` rows and
   `max_tokens` reserved tokens (each request reserves its own input length plus its own
   `max_new_tokens`: admission is length-aware, and in FIFO order so nothing starves);
2. runs the engine step (`engine.py`, the step `generate` runs) over every live row: `hybrid`
   rows verify NAR drafts, `ar` rows feed one token, in one step;
3. returns the requests that finished.

Greedy decoding only, with the checkpoint's repetition controls: `DecodingParams.engine_refusal` says
which requests it runs and why it refuses the rest, which go through `DecodeSession.generate`. Out of memory
on a step preempts the newest half of the rows back to the queue and retries with a lower row
cap, so no job fails for its neighbours; a lone row that still does not fit fails alone. Any
other exception in a step hands the live rows back marked `isolate`, for the caller to rerun
one at a time.

`policy="static"` admits only into an empty working set: static micro-batching with the same
kernels, the baseline `make bench` compares against.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Hashable
from typing import Generic, Literal, TypeVar

import torch

from yue2_jobs.decode.auto_mode import ModeChooser
from yue2_jobs.decode.engine import NEVER_TRUST, StepShape
from yue2_jobs.decode.params import AUTO, DEFAULT_MIN_ACCEPT_PROB, Mode
from yue2_jobs.decode.requests import DecodeRequest, DecodeResult, EngineCounters
from yue2_jobs.decode.sampling import SamplingParams
from yue2_jobs.decode.stats import SequenceStats
from yue2_jobs.decode.steps import Steps
from yue2_jobs.decode.working_set import Slot, WorkingSet

K = TypeVar("K", bound=Hashable)
RECOVER_EVERY = 64  # clean steps before an out-of-memory row cap is raised by one again


def is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


class ContinuousBatcher(Generic[K]):
    """Iteration-level scheduler and decode loop over one model (see the module docstring)."""

    def __init__(self, steps: Steps, chooser: ModeChooser, *, max_rows: int = 32, max_tokens: int | None = None,
                 policy: Literal["continuous", "static"] = "continuous",
                 min_accept_prob: float = DEFAULT_MIN_ACCEPT_PROB) -> None:
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        if policy not in ("continuous", "static"):
            raise ValueError(f"policy must be 'continuous' or 'static', got {policy!r}")
        if not 0.0 <= min_accept_prob <= 1.0:
            raise ValueError(f"min_accept_prob must be between 0 and 1, got {min_accept_prob}")
        model = steps.model
        cfg = model.config
        self.steps, self.model, self.chooser = steps, model, chooser
        self.policy, self.max_rows, self.min_accept_prob = policy, max_rows, min_accept_prob
        self._timing: tuple[Mode, int, float, torch.Tensor] | None = None  # (mode, rows, start, tokens) of a step
        self.limit = cfg.max_position_embeddings - 1  # most new tokens a row may ask for
        self.max_tokens = max_tokens if max_tokens is not None else max_rows * (cfg.max_position_embeddings * 2)
        self.k = cfg.nar_block_size
        # Every row decodes greedily with the checkpoint's repetition controls; a request that
        # sets its own is refused (`DecodingParams.engine_refusal`) and goes through `generate`.
        self.params = SamplingParams.greedy(model.generation_config)
        self.t_cache = 1 + self.limit + self.k + 1
        self.device = model.shared.weight.device
        self.ws: WorkingSet[K] = WorkingSet(model, t_buf=1 + self.limit + 2 * self.k + 2, t_cache=self.t_cache)
        self.waiting: deque[DecodeRequest[K]] = deque()
        self.rejected: list[DecodeResult[K]] = []
        self.row_cap = max_rows
        self.clean_steps = 0
        self.counters = EngineCounters()
        self._seq = itertools.count()

    @property
    def live(self) -> int:
        return self.ws.live

    # ---- public -------------------------------------------------------------------------------

    def submit(self, requests: list[DecodeRequest[K]], *, first: bool = False) -> None:
        """Queue requests (`first`: ahead of those waiting, in their order); an invalid one comes
        back failed from the next `step`, alone."""
        valid: list[DecodeRequest[K]] = []
        for req in requests:
            problem = self._check(req)
            if problem:
                self.rejected.append(DecodeResult(request=req, error=ValueError(problem)))
            else:
                valid.append(req)
        if first:
            self.waiting.extendleft(reversed(valid))
        else:
            self.waiting.extend(valid)

    def has_work(self) -> bool:
        return bool(self.waiting or self.rejected or self.live)

    @torch.inference_mode()
    def step(self) -> list[DecodeResult[K]]:
        """Admit, decode one step, return what finished (possibly nothing)."""
        done, self.rejected = self.rejected, []
        done += self._admit()
        if not self.live:
            return done
        while True:
            try:
                self._decode_step()
                break
            except Exception as exc:
                if not is_out_of_memory(exc):
                    done += self._evict_all(exc)
                    return done
                done += self._shed(exc)
                if not self.live:
                    return done
        self.clean_steps += 1
        if self.clean_steps % RECOVER_EVERY == 0 and self.row_cap < self.max_rows:
            self.row_cap += 1
        done += self._collect()
        return done

    def abandon(self) -> list[DecodeRequest[K]]:
        """Drop every waiting and live request (their caller gave up on them); returns them."""
        dropped = [*self.waiting, *(r.request for r in self.rejected), *(s.request for s in self.ws.live_slots())]
        self.waiting.clear()
        self.rejected = []
        self._clear()
        return dropped

    def run(self, requests: list[DecodeRequest[K]]) -> list[DecodeResult[K]]:
        """Decode `requests` to the end; results in request order."""
        self.submit(requests)
        by_id: dict[int, DecodeResult[K]] = {}
        while self.has_work():
            for res in self.step():
                by_id[id(res.request)] = res
        return [by_id[id(r)] for r in requests]

    def _clear(self) -> None:
        self.ws.clear()
        self.counters.occupancy = []

    # ---- admission ----------------------------------------------------------------------------

    def _check(self, req: DecodeRequest[K]) -> str | None:
        n_pos = self.model.config.max_position_embeddings
        p = req.params
        refusal = p.engine_refusal  # which requests the engine runs is DecodingParams' to say
        if refusal is not None:
            return refusal
        if not 1 <= p.max_new_tokens <= self.limit:
            return f"max_new_tokens must be between 1 and {self.limit}, got {p.max_new_tokens}"
        if not 0 <= req.min_new_tokens <= p.max_new_tokens:
            return (f"min_new_tokens must be between 0 and max_new_tokens ({p.max_new_tokens}), "
                    f"got {req.min_new_tokens}")
        if not 1 <= len(req.input_ids) <= n_pos:
            return f"input must have 1 to {n_pos} tokens, got {len(req.input_ids)}"
        return None

    @staticmethod
    def _reserve(req: DecodeRequest[K]) -> int:
        return len(req.input_ids) + 1 + req.params.max_new_tokens

    def _admit(self) -> list[DecodeResult[K]]:
        if not self.waiting or (self.policy == "static" and self.live):
            return []
        free = [i for i, s in enumerate(self.ws.slots) if s is None]
        room = len(free) + max(0, min(self.max_rows, self.row_cap) - len(self.ws.slots))
        budget = self.max_tokens - sum(self._reserve(s.request) for s in self.ws.live_slots())
        take: list[DecodeRequest[K]] = []
        while self.waiting and len(take) < room:
            need = self._reserve(self.waiting[0])
            if need > budget and (take or self.live):
                break  # FIFO: the head waits for room rather than being overtaken
            take.append(self.waiting.popleft())
            budget -= need
        while take:
            try:
                self._place(take, free)
                return []
            except Exception as exc:
                if not is_out_of_memory(exc) and len(take) == 1:
                    return [DecodeResult(request=take[0], error=exc)]
                if len(take) == 1:  # does not fit even alone, next to the live rows
                    if self.live:
                        self.waiting.appendleft(take[0])
                        return []
                    return [DecodeResult(request=take[0], error=exc)]
                half = len(take) // 2  # find the bad input, or admit what fits
                self.waiting.extendleft(reversed(take[half:]))
                take = take[:half]
        return []

    def _place(self, take: list[DecodeRequest[K]], free: list[int]) -> None:
        """Encode `take` and write it into free slots, growing the working set as needed."""
        pad = self.model.config.pad_token_id
        auto = self.chooser.choose(self.live + len(take))  # one pick for the newcomers: a set of one width
        modes: list[Mode] = [auto if r.params.mode == AUTO else r.params.mode for r in take]
        s_new = max(len(r.input_ids) for r in take)
        ids = torch.full((len(take), s_new), pad, dtype=torch.long, device=self.device)  # (N, S)
        mask = torch.zeros_like(ids, dtype=torch.bool)
        for i, r in enumerate(take):
            ids[i, : len(r.input_ids)] = torch.tensor(r.input_ids, dtype=torch.long)
            mask[i, : len(r.input_ids)] = True
        enc = self.steps.prefill(ids, mask)
        new_mask = torch.zeros(mask.shape, dtype=enc.hidden.dtype, device=self.device)
        new_mask = new_mask.masked_fill(~mask, float("-inf"))[:, None, None, :]  # (N, 1, 1, S)
        ws = self.ws
        slots = free[: len(take)]
        grow = len(take) - len(slots)
        if grow:
            slots += list(range(len(ws.slots), len(ws.slots) + grow))
            ws.grow(grow)
        idx = torch.tensor(slots, dtype=torch.long, device=self.device)
        ws.write_sources(idx, new_mask, [*enc.cross_kv, *enc.nar_cross_kv])
        ws.st.start(idx, start_token=self.model.config.decoder_start_token_id, pad=pad,
                    total=torch.tensor([1 + r.params.max_new_tokens for r in take], device=self.device),
                    min_total=torch.tensor([1 + r.min_new_tokens for r in take], device=self.device),
                    draft_on=torch.tensor([m == "hybrid" for m in modes], device=self.device),
                    accept_p=self.min_accept_prob, trust_p=NEVER_TRUST)
        for slot, r, m in zip(slots, take, modes, strict=True):
            ws.slots[slot] = Slot(request=r, mode=m, seq=next(self._seq))

    # ---- the decoder step ------------------------------------------------------------------------

    def _decode_step(self) -> None:
        """One engine step over every row (idle slots are finished rows: they commit nothing).
        The step writes state only once nothing can fail, which `_shed` relies on."""
        ws = self.ws
        live = ws.live_slots()
        modes = {s.mode for s in live}
        timed = len(modes) == 1  # only steps of one mode tell `auto` what that mode costs
        before = ws.st.nar.sum() + ws.st.ar.sum() if timed else None
        start = time.perf_counter()
        shape = StepShape.of(k=self.k, drafts="nar" if "hybrid" in modes else "none", params=self.params,
                             ban_eos=any(s.request.min_new_tokens > 0 for s in live))
        layout = self.steps.layout()
        # A replayed graph has a fixed width; without one, slots no draft fills would only cost.
        if not self.steps.covers(shape, rows=len(ws.slots)) and layout.narrow_pays:
            shape = shape.narrowed(ws.max_drafts)
        self.steps.run(ws.st, ws.encoder_state(), ws.caches, layout=layout, shape=shape,
                       span=min(self.t_cache, ws.reach + shape.width))
        ws.reach += shape.width
        if before is not None:  # the step's token count is read with the finished flags, in `_collect`
            self._timing = (modes.pop(), len(live), start, ws.st.nar.sum() + ws.st.ar.sum() - before)
        c = self.counters
        c.steps += 1
        c.live_rows += len(live)
        c.slot_rows += len(ws.slots)
        c.occupancy.append(len(live))

    def _collect(self) -> list[DecodeResult[K]]:
        """Hand back finished rows and free their slots; compact when refilling cannot use them."""
        ws = self.ws
        st = ws.st
        if not ws.slots:
            return []
        # The host read, in one transfer: every row's finished flag, the caches' reach and the most
        # drafts a row holds (the next step's width when it is narrowed).
        timing, self._timing = self._timing, None
        extra = [st.cached.max(0, keepdim=True).values, st.n_drafts.max(0, keepdim=True).values]
        values = torch.cat([st.finished.long(), *extra] + ([timing[3][None]] if timing else [])).tolist()
        n = len(ws.slots)
        fin, ws.reach, ws.max_drafts = values[:n], values[n], values[n + 1]
        if timing:  # what the step cost feeds `auto`'s choice (steps of one mode only)
            self.chooser.observe(timing[0], timing[1], tokens=values[n + 2], seconds=time.perf_counter() - timing[2])
        ended = [i for i, (s, f) in enumerate(zip(ws.slots, fin, strict=True)) if f and s is not None]
        results: list[DecodeResult[K]] = []
        if ended:
            idx = torch.tensor(ended, dtype=torch.long, device=self.device)
            lens = st.committed[idx].tolist()
            rows = st.buf[idx].tolist()
            stats = torch.stack([st.steps[idx], st.nar[idx], st.ar[idx], st.drafted[idx]], 1).tolist()
            c = self.counters
            for i, n_tok, toks, (steps, nar, ar_, drafted) in zip(ended, lens, rows, stats, strict=True):
                slot = ws.slots[i]
                assert slot is not None
                ws.slots[i] = None
                c.tokens += nar + ar_
                c.nar_tokens += nar
                c.drafted += drafted
                results.append(DecodeResult(request=slot.request, tokens=toks[1:n_tok], mode=slot.mode,
                                            stats=SequenceStats(decoder_steps=steps, nar_tokens=nar, ar_tokens=ar_,
                                                                drafted_tokens=drafted)))
        idle = len(ws.slots) - self.live
        refill = self.waiting and (self.policy == "continuous" or not self.live)
        if idle and (not self.live or (not refill and 4 * idle >= len(ws.slots))):
            ws.keep([i for i, s in enumerate(ws.slots) if s is not None])
        return results

    # ---- failures ------------------------------------------------------------------------------

    def _shed(self, exc: BaseException) -> list[DecodeResult[K]]:
        """Out of memory on a step: requeue the newest half of the live rows (their progress is
        recomputed later) and cap the row count; a lone row fails alone."""
        self.counters.oom_events += 1
        ws = self.ws
        live = sorted(((i, s) for i, s in enumerate(ws.slots) if s is not None), key=lambda held: held[1].seq)
        if len(live) == 1:
            self._clear()
            return [DecodeResult(request=live[0][1].request, error=exc)]
        keep, back = live[: len(live) // 2], live[len(live) // 2:]
        self.waiting.extendleft(reversed([s.request for _, s in back]))
        self.counters.preempted += len(back)
        self.row_cap = len(keep)
        self.clean_steps = 0
        ws.keep(sorted(i for i, _ in keep))
        return []

    def _evict_all(self, exc: BaseException) -> list[DecodeResult[K]]:
        out = [DecodeResult(request=s.request, error=exc, isolate=True) for s in self.ws.live_slots()]
        self._clear()
        return out
