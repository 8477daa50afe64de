#!/usr/bin/env bash
# GPU host run: the GPU tests, then a deploy of the default recipe without
# TensorRT engines (no TensorRT runtime there), keeping the reports (not the artifacts) under $OUT.
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD
out=${OUT:-/tmp/out}
root=/tmp/gpu-artifacts
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/nvidia-smi.txt"
python3 -m pytest -q -m gpu tests -p no:cacheprovider 2>&1 | tail -15 | tee "$out/pytest-gpu.txt"
variants='[torchscript-fp32, onnx-fp32, onnx-fp16, onnx-int8, onnx-int8-dynamic, onnx-optimized-fp32, onnx-optimized-fp16]'
time python3 -m pipeline deploy recipes/bert.yaml --set output.root=$root --set "variants.build=$variants" \
  --set "benchmark.batch_sizes=${BATCHES:-[1,32]}" "$@" 2>&1 | grep -v '^W[0-9]' | tee "$out/deploy.txt"
echo "exit ${PIPESTATUS[0]}" >> "$out/deploy.txt"
latest=$(readlink -f $root/bert/latest || ls -d $root/bert/v* | tail -1)
# the device tool brings back only a few files: keep the ones a reader needs
cp "$latest"/reports/speed.json "$latest"/reports/accuracy.json "$latest"/reports/signoff.md "$out/" 2>/dev/null
cp "$latest"/winner.json "$out/" 2>/dev/null
ls -la "$out"
