#!/usr/bin/env bash
# The GPU check, one short script: install the model extra if needed, then run bench/gpu_check.py
# on Qwen3-8B's architecture with random weights: a 10-step episode with KV reuse, an 8,192-token
# prefill, and QLoRA steps at 8,192 tokens. Exits non-zero if inference would not fit 24 GB or the
# training recipe peaks at 22 GiB or more. The report lands in ${OUT:-.}/gpu_check.json.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c "import torch, transformers, peft, bitsandbytes" 2>/dev/null; then
    "$PYTHON" -m pip install --quiet -e '.[llm]'
fi
"$PYTHON" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(0))"
exec "$PYTHON" bench/gpu_check.py --out "${OUT:-.}/gpu_check.json" "$@"
