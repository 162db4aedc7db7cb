"""Per-sequence decoding statistics: what each row of a `generate` call cost and where its tokens came from."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class SequenceStats:
    """One output sequence's decoding record.

    `decoder_steps`: decoder forward passes the row took part in (encoder pass excluded).
    `nar_tokens`: tokens that came from the NAR branch (verified or trusted drafts, `nar` mode's
    parallel predictions); `ar_tokens`: tokens the AR branch chose itself. Their sum counts every
    generated token up to and including EOS. `accepted_histogram[n]`: steps that committed n
    NAR tokens. `drafted_tokens`: drafts sent to verification; in `hybrid` and `prompt_lookup`
    `nar_tokens / drafted_tokens` is the drafter's acceptance (in `hybrid_fast` `nar_tokens` also
    counts the trusted, unverified drafts, so the ratio is not one there).
    """

    decoder_steps: int
    nar_tokens: int
    ar_tokens: int
    accepted_histogram: list[int] = field(default_factory=list)
    drafted_tokens: int = 0

    @property
    def tokens(self) -> int:
        return self.nar_tokens + self.ar_tokens

    @property
    def tokens_per_step(self) -> float:
        """tau: mean tokens committed per decoder step."""
        return self.tokens / self.decoder_steps if self.decoder_steps else 0.0


class StatsRecorder:
    """Accumulates per-row counts on the device; `finish` turns them into `SequenceStats`."""

    def __init__(self, batch_size: int, *, max_nar_per_step: int, device: torch.device) -> None:
        self.steps = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.nar = torch.zeros_like(self.steps)
        self.ar = torch.zeros_like(self.steps)
        self.drafted = torch.zeros_like(self.steps)
        self.histogram = torch.zeros(batch_size, max_nar_per_step + 1, dtype=torch.long, device=device)

    def record_rows(self, rows: torch.Tensor, *, steps: torch.Tensor, nar: torch.Tensor, ar: torch.Tensor,
                    drafted: torch.Tensor, histogram: torch.Tensor) -> None:
        """The finished rows `rows` (R,): their steps, NAR, AR and verified draft tokens (R,) and
        per-row histograms (R, N) of NAR tokens per step (counts past this recorder's width are
        folded into its last bucket)."""
        self.steps[rows], self.nar[rows], self.ar[rows], self.drafted[rows] = steps, nar, ar, drafted
        width = self.histogram.shape[1]
        hist = histogram[:, :width].clone()
        hist[:, -1] += histogram[:, width:].sum(1)
        self.histogram[rows] = hist

    def record_parallel(self, *, steps: int, nar: torch.Tensor, ar: torch.Tensor) -> None:
        """Every row decoded in `steps` fully parallel passes (`nar` mode), nar + ar tokens each (B,)."""
        self.steps += steps
        self.nar += nar
        self.ar += ar

    def finish(self) -> list[SequenceStats]:
        hist = self.histogram.tolist()
        out = []
        for i, (steps, nar, ar, drafted) in enumerate(zip(self.steps.tolist(), self.nar.tolist(), self.ar.tolist(),
                                                          self.drafted.tolist(), strict=True)):
            h = hist[i]
            while len(h) > 1 and h[-1] == 0:
                h.pop()
            out.append(SequenceStats(decoder_steps=steps, nar_tokens=nar, ar_tokens=ar, accepted_histogram=h,
                                     drafted_tokens=drafted))
        return out


def summarize_stats(stats: list[SequenceStats]) -> dict[str, object]:
    """Batch totals: tokens, decoder steps, tau, share of NAR tokens, the drafter's acceptance
    (accepted / verified drafts; None where nothing was verified) and the summed histogram."""
    tokens = sum(s.tokens for s in stats)
    drafted = sum(s.drafted_tokens for s in stats)
    steps = sum(s.decoder_steps for s in stats)
    width = max((len(s.accepted_histogram) for s in stats), default=1)
    hist = [sum(s.accepted_histogram[i] for s in stats if i < len(s.accepted_histogram)) for i in range(width)]
    return {"tokens": tokens, "decoder_steps": steps, "tau": tokens / steps if steps else 0.0,
            "nar_share": sum(s.nar_tokens for s in stats) / tokens if tokens else 0.0,
            "acceptance": sum(s.nar_tokens for s in stats) / drafted if drafted else None, "accepted_histogram": hist}
