#!/usr/bin/env bash
# One command for whoever has a GPU (issue 15): the decode tables on the shipped checkpoints at batch
# 1, 8, 32 and 128, the continuous engine on CUDA for hybrid and ar, and the step cost on random
# weights in BART-base and BART-large shapes (bf16, CUDA graphs) with the roofline share.
# Budget: about 6 minutes on one H200. Writes JSON and text under the directory given.
#
#   benchmarks/gpu_check.sh OUT_DIR
#
# Run from the repository root with a Python that has torch (CUDA), transformers and rouge-score
# (PYTHON overrides `python3`; PYTHONPATH as the environment needs).
set -euo pipefail
out=${1:?usage: benchmarks/gpu_check.sh OUT_DIR}
py=${PYTHON:-python3}
mkdir -p "$out"
cd "$(dirname "$0")/.."
"$py" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(0))" \
  | tee "$out/device.txt"

run() {  # name, time limit (s), command...: text to $out/name.txt; a piece that fails or overruns is reported
  local name=$1 limit=$2; shift 2
  echo "== $name" | tee -a "$out/summary.txt"
  if timeout "$limit" "$@" > "$out/$name.txt" 2>&1; then tail -n 40 "$out/$name.txt"; else
    echo "!! $name failed or ran past ${limit}s (see $name.txt)" | tee -a "$out/summary.txt"; fi
}

run step_cost 90 "$py" benchmarks/step_cost.py --shapes base large --batch-sizes 1 32 --out "$out/step_cost.json"
run decode_base 100 "$py" benchmarks/decode.py --batch-sizes 1 8 32 128 --texts 128 --repeats 2 \
  --methods "HF generate" CTranslate2 hybrid --out "$out/decode_base.json"
run decode_legal 80 "$py" benchmarks/decode.py --checkpoint checkpoints/legal --eval-set legal \
  --batch-sizes 1 8 32 128 --texts 128 --repeats 2 --methods "HF generate" CTranslate2 hybrid \
  --out "$out/decode_legal.json"
run continuous_hybrid 45 "$py" benchmarks/continuous.py --device cuda --mode hybrid --jobs 256 --repeats 1 \
  --out "$out/continuous_hybrid.json"
run continuous_ar 45 "$py" benchmarks/continuous.py --device cuda --mode ar --jobs 256 --repeats 1 \
  --out "$out/continuous_ar.json"
echo "wrote $out" | tee -a "$out/summary.txt"
