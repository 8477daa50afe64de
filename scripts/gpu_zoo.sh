#!/usr/bin/env bash
# GPU host run of the model zoo: models nobody here tuned for, deployed as a user deploys them, with every GPU
# variant at batches 1, 32 and 256. First the big ones of tests/zoo/gpu (torchvision ResNet-50 and BERT-base,
# random weights, seeded), one at a time (their speed tables are measurements); then the CPU zoo's tiny models
# (tests/zoo/recipes) with the GPU variants added, ZOO_JOBS at a time (correctness only: they share the GPU).
# Prints each model's verdict, failures, claims check and speed table (scripts/zoo_summary.py); writes
# $OUT/zoo.md and $OUT/reports.tgz (every version's reports/, winner.json and manifest.json).
# Environment: MODELS (default "resnet50 bert-base"; empty: none), TINY=0 skips the tiny zoo, ZOO_JOBS (4),
# DEPLOY_TIMEOUT (s, per deploy), ROOT (the output root), SET (recipe overrides for the big models, separated by
# spaces, e.g. SET="export.pt2.max_autotune=true").
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD
unset PYTHONDONTWRITEBYTECODE  # see scripts/gpu_smoke.sh
out=${OUT:-/tmp/out}
root=${ROOT:-/tmp/gpu-zoo}
mkdir -p "$out" "$root/big" "$root/tiny"
gpu='[exported-fp16, aoti-fp16, aoti-fp8, aoti-int8]'
overrides=()
for item in ${SET:-}; do overrides+=(--set "$item"); done
for model in ${MODELS-resnet50 bert-base}; do
  start=$(date +%s)
  timeout "${DEPLOY_TIMEOUT:-900}" python3 -m pipeline deploy "tests/zoo/gpu/$model.yaml" \
    --set "output.root=$root/big" "${overrides[@]}" > "$out/$model.log" 2>&1
  echo "$model: exit $? after $(( $(date +%s) - start )) s" | tee -a "$out/times.txt"
done
if [ "${TINY:-1}" != 0 ]; then
  start=$(date +%s)
  ls tests/zoo/recipes/*.yaml | xargs -P "${ZOO_JOBS:-4}" -I{} sh -c \
    'timeout '"${DEPLOY_TIMEOUT:-900}"' python3 -m pipeline deploy {} --set output.root='"$root/tiny"' \
       --set "variants.gpu='"$gpu"'" --set "benchmark.batch_sizes=[1,32,256]" --set dims.batch.max=256 \
       > /dev/null 2>&1; echo "$(basename {}): exit $?"' | tee -a "$out/times.txt"
  echo "tiny zoo: $(( $(date +%s) - start )) s" | tee -a "$out/times.txt"
fi
python3 scripts/zoo_summary.py "$root/big" "$root/tiny" > "$out/zoo.md"
echo "zoo summary exit $?" | tee -a "$out/times.txt"
grep -E '^## |FAILED|DOES NOT HOLD|digest|winner' "$out/zoo.md"
tar czf "$out/reports.tgz" -C "$root" --exclude='*.onnx' --exclude='*.ts' --exclude='*.pt2' --exclude='*.engine' \
  --exclude='.cache' --exclude='.work' --exclude='.tmp' --exclude='logs' big tiny 2>/dev/null
ls -la "$out"
