"""The draft vocabulary: the token ids the NAR branch may propose (`Yue2Config.draft_vocab_size`).

Built from the checkpoint's own outputs (the AR branch's greedy decodes the NAR stage distils), as
the fewest ids that cover a share of those output tokens (`coverage`, 0.97 by default): the
drafts are projected onto these ids only, so a step drafts at a fraction of the vocabulary's cost,
and the few tokens left out are ones a drafter rarely gets right anyway. Verification scores the
whole vocabulary, so output never depends on it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

DEFAULT_COVERAGE = 0.97


def shortlist(sequences: Iterable[Sequence[int]], *, coverage: float = DEFAULT_COVERAGE,
              always: Iterable[int] = ()) -> list[int]:
    """The fewest ids, most frequent first (ties: lower id first), whose occurrences in
    `sequences` reach `coverage` of all tokens, plus `always` (EOS: a draft must be able to end a
    row); sorted."""
    if not 0.0 < coverage <= 1.0:
        raise ValueError(f"coverage must be in (0, 1], got {coverage}")
    counts = Counter(tok for seq in sequences for tok in seq)
    total = sum(counts.values())
    chosen, covered = set(always), 0
    for tok, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if covered >= coverage * total:
            break
        chosen.add(tok)
        covered += n
    return sorted(chosen)


def coverage_of(ids: Iterable[int], sequences: Iterable[Sequence[int]]) -> float:
    """The share of the tokens in `sequences` that `ids` holds."""
    keep = set(ids)
    total = hit = 0
    for seq in sequences:
        total += len(seq)
        hit += sum(tok in keep for tok in seq)
    return hit / total if total else 1.0
