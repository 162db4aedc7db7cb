"""What a job's `long_input` setting does with an input longer than its checkpoint reads.

- `truncate` (the default): the encoder reads the first `limit` tokens; the job records that.
- `reject`: the job fails with `InputTooLongError`, which names the limit.
- `chunk`: map-reduce, as long-document summarisers do. The input is split at sentence
  boundaries into windows that fit (`windows`), each window is summarised, and the joined
  partial summaries are summarised again, split again if they still do not fit.

The limit is the checkpoint's: its tokenizer's `model_max_length` (the input length it was
trained on), capped by the model's positions. Counts include the `<s>` and `</s>` the tokenizer adds.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from yue2_jobs.errors import InvalidRequestError
from yue2_jobs.sentences import split_sentences

MAX_REDUCE_LEVELS = 4  # summaries are far shorter than their windows: 2 levels cover ~40k words


class InputTooLongError(InvalidRequestError):
    """long_input=reject: the input has more tokens than the checkpoint reads (permanent)."""

    def __init__(self, *, field: str, tokens: int, limit: int, checkpoint: str) -> None:
        super().__init__(f"{field} is {tokens:,} tokens, over the limit of {limit:,} tokens that {checkpoint} reads "
                         "(long_input=reject; long_input=truncate or chunk accepts it)", field=field,
                         code="input_too_long")
        self.tokens, self.limit = tokens, limit


def count_tokens(tokenizer: PreTrainedTokenizerBase, text: str) -> int:
    return len(tokenizer(text, verbose=False)["input_ids"])


def windows(tokenizer: PreTrainedTokenizerBase, text: str, limit: int) -> list[str]:
    """`text` as consecutive windows of at most `limit` tokens each (specials included), cut at
    sentence boundaries; a sentence longer than a window is cut between words, and a word
    longer than a window between tokens."""
    # Room left by <s> ... </s>, less one: pieces are counted with their leading space, which
    # the first piece of a window lacks, and " x" and "x" may differ by a token.
    budget = limit - len(tokenizer("")["input_ids"]) - 1
    if budget < 1:
        raise ValueError(f"limit {limit} leaves no room for text")
    out: list[str] = []
    current: list[str] = []
    used = 0
    for sentence in split_sentences(text):
        for piece, n in _pieces(tokenizer, sentence, budget):
            if current and used + n > budget:
                out.append(" ".join(current))
                current, used = [], 0
            current.append(piece)
            used += n
    if current:
        out.append(" ".join(current))
    return out


def _pieces(tokenizer: PreTrainedTokenizerBase, sentence: str, budget: int) -> list[tuple[str, int]]:
    """The sentence whole when it fits `budget` tokens, else cut into pieces that do, with their counts."""
    n = _bare_count(tokenizer, sentence)
    if n <= budget:
        return [(sentence, n)]
    pieces: list[tuple[str, int]] = []
    words: list[str] = []
    used = 0
    for word in sentence.split():
        w = _bare_count(tokenizer, word)
        if w > budget:  # one "word" longer than a window (a hash, a URL): cut it by tokens
            if words:
                pieces.append((" ".join(words), used))
                words, used = [], 0
            ids = tokenizer(word, add_special_tokens=False, verbose=False)["input_ids"]
            for start in range(0, len(ids), budget):
                part = ids[start : start + budget]
                pieces.append((str(tokenizer.decode(part)), len(part)))
            continue
        if words and used + w > budget:
            pieces.append((" ".join(words), used))
            words, used = [], 0
        words.append(word)
        used += w
    if words:
        pieces.append((" ".join(words), used))
    return pieces


def _bare_count(tokenizer: PreTrainedTokenizerBase, text: str) -> int:
    """Tokens of `text` after a space, as it appears inside a window: a byte-level BPE
    pre-tokenizes at spaces, so these counts add up to the window's."""
    return len(tokenizer(" " + text, add_special_tokens=False, verbose=False)["input_ids"])
