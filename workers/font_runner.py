"""The runner of `yue2.fonts` workers: render jobs on the CPU, no model (same worker machinery:
claims, leases, heartbeat, reconciler, uploads, metrics). A job whose text has characters no
font draws, or whose canvas is over the limit, fails alone with the reason; any other exception
of one render fails that job only."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from workers.job_io import JobInput, JobOutput
from yue2_jobs.core.config import Settings
from yue2_jobs.errors import InvalidRequestError, JobExecutionError, PipelineError
from yue2_jobs.fonts.catalog import DATA_DIR, FONTS, load
from yue2_jobs.fonts.render import RenderParams, layout, render

log = logging.getLogger(__name__)


def fonts_version() -> str:
    """The first 12 hex digits of the sha256 over the shipped font files: names what rendered a job."""
    h = hashlib.sha256()
    for spec in sorted(FONTS.values(), key=lambda s: s.file):
        h.update((DATA_DIR / spec.file).read_bytes())
    return h.hexdigest()[:12]


class FontRunner:
    """A `Runner` (workers.protocol) without an engine: each job renders on its own."""

    def __init__(self, *, variant: str, settings: Settings, directory: Path | None = None) -> None:
        self.variant, self.settings = variant, settings
        self.weights_sha256: str | None = None
        self.checkpoint: str = f"{variant}@{fonts_version()}"
        for style in FONTS:  # open every font before the first job
            load(style)

    def run(self, jobs: list[JobInput]) -> list[JobOutput | Exception]:
        return [self._one(job) for job in jobs]

    def _one(self, job: JobInput) -> JobOutput | Exception:
        try:
            p = RenderParams(text=job.text, **job.params)
            lay = layout(p)  # raises GlyphsMissingError, naming the characters
            if lay.width * lay.height > self.settings.render_max_pixels:
                raise InvalidRequestError(f"the rendering would be {lay.width}x{lay.height} px, over the limit of "
                                          f"{self.settings.render_max_pixels:,} pixels; shorten the text or "
                                          f"lower font_size", field="text")
            r = render(p)
        except PipelineError as exc:
            return exc
        except Exception as exc:  # a bug or a font problem: this job fails, its batch-mates do not
            log.exception("render job %s failed", job.id)
            return JobExecutionError(f"rendering failed: {type(exc).__name__}: {exc}")
        files = []
        if r.svg is not None:
            files.append(("svg", r.svg.encode(), "image/svg+xml"))
        if r.png is not None:
            files.append(("png", r.png, "image/png"))
        return JobOutput(text="", input_tokens=len(job.text), output_tokens=r.glyphs, decoder_steps=0, nar_tokens=0,
                         files=tuple(files),
                         extra={"render": {"width": r.width, "height": r.height, "lines": r.lines,
                                           "glyphs": r.glyphs, "style": p.style, "fallbacks": r.fallbacks}})

