#!/usr/bin/env bash
# GPU host run: the GPU tests, then a deploy of the default recipe with every
# GPU-capable variant (no TensorRT engines: no TensorRT runtime there) at batches 1, 32 and 256 (validated on
# every runtime it times), and the speed table; the reports (not the artifacts) go to $OUT.
# Environment: SKIP_TESTS=1 skips pytest; VARIANTS and BATCHES override the defaults below (VARIANTS= : the recipe's own); DEPLOY_TIMEOUT (s);
# ROOT is the output root (the reports are read from there: not --set output.root).
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD
# Triton's Python backend stub imports from the environment of the interpreter that starts it (found through
# PATH), not from PYTHONPATH: the staged packages reach it through a venv that sees the system's packages and,
# by a .pth file, /tmp/site (docs/gpu.md, the H100 sitting).
py=/tmp/venv/bin/python3
[ -x "$py" ] || python3 -m venv --system-site-packages /tmp/venv
# /tmp/site, then every package folder the host's python3 sees (its user site too, which a venv leaves out)
{ echo /tmp/site; python3 -c 'import sys; print("\n".join(p for p in sys.path if p.endswith("-packages")))'; } \
  > "$("$py" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/staged.pth"
# The GPU host sets PYTHONDONTWRITEBYTECODE=1 and its staged packages are installed without byte code, so every
# Python process compiled again the sources it imports that had none (the imports took 15.1 s, 12.1 s with byte
# code): let Python keep the byte code, as an installed environment has it.
unset PYTHONDONTWRITEBYTECODE
out=${OUT:-/tmp/out}
root=${ROOT:-/tmp/gpu-artifacts}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
if [ -z "${SKIP_TESTS:-}" ]; then
  "$py" -m pytest -q -rs -m gpu tests -p no:cacheprovider 2>&1 | tail -30 | tee "$out/pytest-gpu.txt"
fi
# ONNX graphs ONNX Runtime's CUDA provider runs (the dynamic INT8 graph's ops are CPU-only), TorchScript traced
# on the GPU, and the compiled PyTorch artifacts (variants.gpu of the recipe adds exported-fp16, aoti-fp16 and the
# packed FP16 graph, onnx-packed-fp16, with the packed FP32 graph it is converted from).
# BF16 (exported-bf16, aoti-bf16) costs another AOTInductor compile (70 s on the H200) and a torch.compile: add
# it through VARIANTS when that time is available.
variants=${VARIANTS-'[torchscript-fp32, onnx-fp32, onnx-fp16, onnx-int8, onnx-optimized-fp32, onnx-optimized-fp16, exported-fp16, aoti-fp16]'}
# VARIANTS set and empty: the recipe's own variants.build, as `make deploy RECIPE=bert.yaml` builds them
choice=()
[ -n "$variants" ] && choice=(--set "variants.build=$variants")
batches=${BATCHES:-'[1,32,256]'}
start=$(date +%s)
timeout "${DEPLOY_TIMEOUT:-900}" "$py" -m pipeline deploy recipes/bert.yaml --set output.root=$root \
  "${choice[@]}" --set "benchmark.batch_sizes=$batches" --set dims.batch.max=256 "$@" 2>&1 \
  | grep -v '^W[0-9]' | tee "$out/deploy.txt"
echo "exit ${PIPESTATUS[0]} after $(( $(date +%s) - start )) s" | tee -a "$out/deploy.txt"
# the newest version, signed off or not (its reports say why)
latest=$(ls -d $root/bert/v* | sort | tail -1)
"$py" scripts/speed_table.py "$latest/reports/speed.json" --accuracy "$latest/reports/accuracy.json" \
  | tee "$out/speed_table.md"
# the device tool brings back at most 8 files: keep the ones a reader needs
cp "$latest"/reports/speed.json "$latest"/reports/accuracy.json "$latest"/reports/signoff.md "$out/" 2>/dev/null
if [ -f "$latest/reports/load.json" ]; then  # with the server scenario
  through=$("$py" -c "import json,sys; print(json.load(open(sys.argv[1]))['through'])" "$latest/reports/load.json")
  cp "$latest/reports/load.json" "$out/load-$through.json"
  "$py" scripts/load_table.py "$through=$latest/reports/load.json" | tee "$out/load_table-$through.md"
fi
cp "$latest"/winner.json "$latest"/manifest.json "$out/" 2>/dev/null
ls -la "$out"
