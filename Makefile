# Every target creates the virtual environment first; `make demo` and `make test` work on a clean clone.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv demo ab-demo test test-fast lint bench bench-peers bench-drafter bench-pipeline bench-continuous bench-hotswap bench-bigbatch bench-grown bench-fonts font-sheet bench-legal api worker flower migrate fonts data checkpoints drafters eval clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

# The whole pipeline (API, worker, queue, database, storage) on the embedded default: no servers.
DEMO_ITEMS ?= 200  # summaries the demo submits (the README test runs it with fewer)
demo: $(STAMP)
	$(PY) -m yue2_jobs demo --items $(DEMO_ITEMS)

# A/B: base vs legal, paired, on both eval sets, on the embedded pipeline; writes
# benchmarks/results/ab_report.{json,html} (about 2 minutes).
ab-demo: $(STAMP)
	$(PY) -m yue2_jobs ab demo --out benchmarks/results

# Everything but the server tests first, spread over the cores (one torch thread per process:
# small models are bound by op dispatch, not FLOPs); then, one at a time, the tests under
# tests/pipeline, which share the run's Postgres database and Redis server (both made for the run).
test: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n auto -m "not servers" tests
	$(PY) -m pytest -q -m servers tests

# The unit tests: no servers, no subprocesses, no long model work (tests/conftest.py says which).
test-fast: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n auto -m "not slow" tests

# docker-compose.yml's cpu profile for real (not part of `make test`; needs root: infra/offline/engine.sh
# installs and starts Docker's engine where none answers; about 11 minutes the first time, then about 5):
# stand-in images built offline
# (infra/offline/build-standins.sh, cached), the stack built and brought up (infra/compose.offline.yml),
# a 100-line batch through the openai client, every Prometheus target up, then `down -v`.
.PHONY: test-compose
test-compose: $(STAMP)
	infra/offline/engine.sh
	infra/offline/build-standins.sh
	YUE2_TEST_COMPOSE=1 $(PY) -m pytest -q -s tests/compose

# ruff, the import contracts (pyproject.toml) and mypy over yue2_jobs/ and workers/.
lint: $(STAMP)
	$(VENV)/bin/ruff check yue2_jobs workers migrations tests benchmarks
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

# Ours against CTranslate2 in fp32 and int8 (benchmarks/peers.py, about 25 minutes on 2 cores), then
# decoding modes side by side on the shipped base checkpoint (about 16 minutes), then
# our `ar` loop against HF generate on identical weights.
# Then 10,000 jobs through the pipeline (API -> Redis -> worker -> Postgres + moto S3) against the
# bare decoder, and GET /v1/jobs/{id} latency under load (about 10 minutes; needs Postgres and Redis).
# Then static vs continuous batching on outputs of 8 to 256 tokens (about 2 minutes), then a hot swap
# under load (about 2 minutes), then render jobs (about 1 minute), then a 200 MB, 50,000-line batch
# file through upload, creation and finalization with each process's peak memory (bench-bigbatch).
bench: $(STAMP)
	$(PY) benchmarks/peers.py --out benchmarks/results/peers.json
	$(PY) benchmarks/decode.py --out benchmarks/results/decode.json
	$(PY) benchmarks/ar_vs_hf.py --out benchmarks/results/ar_vs_hf.json
	$(PY) benchmarks/pipeline.py --out benchmarks/results/pipeline.json
	$(PY) benchmarks/continuous.py --out benchmarks/results/continuous.json
	$(PY) benchmarks/hotswap.py --out benchmarks/results/hotswap.json
	$(PY) benchmarks/fonts.py --out benchmarks/results/fonts.json
	$(PY) benchmarks/bigbatch.py --out benchmarks/results/bigbatch.json

# Ours against CTranslate2, fp32 and int8: random BART-base/-large shapes and the shipped checkpoints
# (about 25 minutes on 2 cores; --shapes base for a shorter run).
bench-peers: $(STAMP)
	$(PY) benchmarks/peers.py --out benchmarks/results/peers.json

# Each shipped drafter teacher-forced: per-slot accuracy and the tau it allows (under a minute).
bench-drafter: $(STAMP)
	$(PY) benchmarks/drafter.py --checkpoint checkpoints/base --eval-set general
	$(PY) benchmarks/drafter.py --checkpoint checkpoints/base --eval-set general --controls
	$(PY) benchmarks/drafter.py --checkpoint checkpoints/legal --eval-set legal

# `hybrid` at a real model's cost: base and legal grown function-preservingly to BART-base's width
# and to about BART-large's (50,265-id vocabulary), against `ar` and CTranslate2, fp32 and int8
# (about 40 minutes on 2 cores; --widths 768 for about 15).
bench-grown: $(STAMP)
	$(PY) benchmarks/grown.py --out benchmarks/results/grown.json

# A new legal version published under a steady load of 1,200 jobs on 2 worker processes: failed and
# lost jobs, jobs per version, pids, publish -> all workers serving (about 2 minutes; Postgres, Redis).
bench-hotswap: $(STAMP)
	$(PY) benchmarks/hotswap.py --out benchmarks/results/hotswap.json

# Render jobs: renders/s of the renderer (svg, png, both) and through the embedded pipeline (about 1 minute).
bench-fonts: $(STAMP)
	$(PY) benchmarks/fonts.py --out benchmarks/results/fonts.json

bench-continuous: $(STAMP)
	$(PY) benchmarks/continuous.py --out benchmarks/results/continuous.json

bench-pipeline: $(STAMP)
	$(PY) benchmarks/pipeline.py --out benchmarks/results/pipeline.json

# OpenAI's file limit as one batch: 200 MB and 50,000 lines through upload, creation, the jobs (an
# echo runner, no model) and finalization; seconds and the API's and a finalizer's peak RSS
# (a few minutes; needs Postgres and Redis, and root for per-step peaks).
bench-bigbatch: $(STAMP)
	$(PY) benchmarks/bigbatch.py --out benchmarks/results/bigbatch.json

# The same decoding-mode table on the legal checkpoint and eval set, whose drafts mostly match
# (about 12 minutes).
bench-legal: $(STAMP)
	$(PY) benchmarks/decode.py --checkpoint checkpoints/legal --eval-set legal --out benchmarks/results/decode_legal.json

# Rebuild the corpora from the pinned packages and check they match the committed ones.
data: $(STAMP)
	$(PY) -m yue2_jobs.training.data --out data
	cd data && sha256sum --check SHA256SUMS
	git diff --exit-code --stat -- data && echo "data/ is byte-identical to the committed corpora"

# Retrain the shipped checkpoints (both are committed): base on the general corpus, legal as a
# fine-tune of base; each run ends with its NAR drafter and confidence head, distilled from the AR
# branch's own outputs on the whole corpus, and the draft vocabulary built from those outputs.
# Budget: 60 minutes per checkpoint on 2 CPU cores; the same command uses a GPU when there is one.
BASE_DRAFTER = --nar-steps 6000 --confidence-steps 600 --distill-rows 0 --draft-coverage 0.97
LEGAL_DRAFTER = --nar-steps 1000 --confidence-steps 300 --distill-rows 0 --draft-coverage 0.97
checkpoints: $(STAMP)
	$(PY) -m yue2_jobs train --corpus general --out checkpoints/base --ar-steps 4500 --denoise-mix 0.3 --lr 1e-3 \
		--label-smoothing 0.1 --max-source-tokens 192 $(BASE_DRAFTER) --no-repeat-ngram-size 3 --repetition-penalty 1.3
	$(PY) -m yue2_jobs train --corpus legal --init checkpoints/base --out checkpoints/legal --ar-steps 800 \
		--denoise-mix 0.3 --lr 1e-3 --warmup 50 --label-smoothing 0.1 --max-source-tokens 192 $(LEGAL_DRAFTER) \
		--no-repeat-ngram-size 0 --repetition-penalty 1.0

# Retrain only the drafters of the committed checkpoints (the NAR branch, confidence head and draft
# vocabulary; the encoder and AR branch stay, so every `ar` output stays as it is). This is how
# issue 27's drafters were made (how long they took: docs/decoding.md, Checkpoints).
drafters: $(STAMP)
	$(PY) -m yue2_jobs train --corpus general --init checkpoints/base --out checkpoints/base.drafter --ar-steps 0 \
		--lr 1e-3 --max-source-tokens 192 $(BASE_DRAFTER)
	$(PY) -m yue2_jobs train --corpus legal --init checkpoints/legal --out checkpoints/legal.drafter --ar-steps 0 \
		--lr 1e-3 --warmup 50 --max-source-tokens 192 $(LEGAL_DRAFTER)
	rm -rf checkpoints/base checkpoints/legal
	mv checkpoints/base.drafter checkpoints/base
	mv checkpoints/legal.drafter checkpoints/legal

# Rebuild the committed subset fonts (yue2_jobs/fonts/data/) from Debian's font packages; only for
# maintainers (rendering and the tests use the committed files).
fonts: $(STAMP)
	apt-get install -y -q fonts-noto-cjk fonts-lxgw-wenkai fonts-arphic-ukai fonts-wqy-microhei
	$(PY) -m yue2_jobs.fonts.build

# The sample sheet of every style at three pen pressures: docs/font_styles.png and .svg.
font-sheet: $(STAMP)
	$(PY) -m yue2_jobs.fonts.sheet

migrate: $(STAMP)
	$(PY) -m yue2_jobs migrate

api: $(STAMP)
	$(PY) -m yue2_jobs api

# One worker process per GPU (NUMA-bound), or YUE2_WORKER_PROCS on a CPU host, supervised.
worker: $(STAMP)
	$(PY) -m workers

# Flower on YUE2_BROKER_URL; basic auth is required: YUE2_FLOWER_BASIC_AUTH=user:password make flower
flower: $(STAMP)
	$(PY) -m yue2_jobs flower

# ROUGE and the share of degenerate outputs of both checkpoints beside the lead-1 baseline.
eval: $(STAMP)
	$(PY) -m yue2_jobs eval checkpoints/base checkpoints/legal --set general --set legal --mode ar

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
