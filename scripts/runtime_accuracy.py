"""Accuracy of every (artifact, runtime) pair a deployed version's benchmark timed, on this host.

    python scripts/runtime_accuracy.py artifacts/bert/v0001 [--out accuracy_by_runtime.json]

Each runner (CUDA-graph, padding-aware and compiled modes included) runs the recipe's validation batches (the
shape corners and the held-out split) and is compared with the eager FP32 reference: per-token outputs on
real tokens only (positions the mask input marks as padding are not compared), other outputs whole; the gate
is the recipe's cosine minimum for the artifact's precision. A smoke-run check beside the validate stage; it
never changes a version folder. Never imported by pipeline/.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.bench.hosts import has_cuda, is_gpu_runtime  # noqa: E402
from pipeline.recipe_loader import load  # noqa: E402
from pipeline.runners.base import NotRunnable  # noqa: E402
from pipeline.runners.registry import reference_runners, runners_for  # noqa: E402
from pipeline.stages.base import ArtifactRecord, RunContext  # noqa: E402
from pipeline.stages.validate import tolerance_for, validation_batches  # noqa: E402


def lowest_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.reshape(len(a), -1).astype(np.float64), b.reshape(len(b), -1).astype(np.float64)
    den = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return float(((a * b).sum(1) / np.where(den == 0, 1, den)).min())


def compare(ref: np.ndarray, got: np.ndarray, mask: np.ndarray | None) -> tuple[float, float]:
    """(max_abs, lowest cosine): per sample over its real tokens when a mask is given."""
    if mask is None:
        return float(np.abs(ref - got).max()), lowest_cosine(ref, got)
    keep = mask.astype(bool)
    diffs, cosines = [], []
    for i in range(len(ref)):
        r, g = ref[i][keep[i]], got[i][keep[i]]
        diffs.append(float(np.abs(r - g).max()))
        cosines.append(lowest_cosine(r.reshape(1, -1), g.reshape(1, -1)))
    return max(diffs), min(cosines)


def chosen(found: list, gpu: bool) -> list:
    """This host's kind of runtime; host I/O skipped where device I/O computes the same."""
    with_device = {r.runtime for r in found if r.io == "device"}
    return [
        r
        for r in found
        if is_gpu_runtime(r.runtime) == gpu and not (r.io == "host" and r.runtime in with_device)
    ]


def check(runner, batches, want, recipe, tolerance, mask_name, per_token) -> dict:  # noqa: ANN001
    """Worst max_abs and lowest cosine per output over the batches, and the verdict (or the error)."""
    try:
        runner.activate()
        worst: dict[str, list[float]] = {}
        for batch, ref in zip(batches, want, strict=True):
            got = runner.infer(batch.feeds)
            for name in recipe.outputs:
                mask = batch.feeds[mask_name] if name in per_token and mask_name else None
                diff, cos = compare(ref[name], got[name], mask)
                w = worst.setdefault(name, [0.0, 1.0])
                w[0], w[1] = max(w[0], diff), min(w[1], cos)
    except Exception as exc:  # noqa: BLE001 - a runtime that fails is reported, the others go on
        return {"passed": False, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
    finally:
        runner.deactivate()
    gates = {n: (tolerance.outputs.get(n) or tolerance).cosine or tolerance.cosine or 0.0 for n in worst}
    return {
        "outputs": {n: {"max_abs": w[0], "cosine": w[1], "cosine_min": gates[n]} for n, w in worst.items()},
        "passed": all(w[1] >= gates[n] for n, w in worst.items()),
    }


def priority(runtime: str) -> int:
    """Candidates that can win first, plain modes next, the slow-to-compile peers last (a run may be cut)."""
    if "compile" in runtime:
        return 3
    if "aoti" in runtime:
        return 0
    return 1 if "graph" in runtime or "bucketed" in runtime else 2


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("version", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    version = args.version.resolve()
    recipe = load(version / "recipe.yaml").recipe
    ctx = RunContext(recipe, version, Path("/tmp/runtime-accuracy"))
    manifest = json.loads((version / "manifest.json").read_text())
    records = [
        ArtifactRecord(
            a["name"], version / a["path"], a["kind"], a["precision"], a["sha256"], a["stage"], a["details"]
        )
        for a in manifest["artifacts"]
    ]
    batches = validation_batches(ctx)
    reference = reference_runners(ctx)[0]
    reference.activate()
    want = [reference.infer(b.feeds) for b in batches]
    reference.deactivate()
    padding = recipe.runtime.padding
    mask_name = padding.mask_input if padding else None
    per_token = set(padding.per_token_outputs) if padding else set()
    gpu = has_cuda()
    pairs = []
    for record in records:
        found = runners_for(record, ctx)
        if not isinstance(found, NotRunnable):
            pairs += [(record, runner) for runner in chosen(found, gpu)]
    pairs.sort(key=lambda pair: priority(pair[1].runtime))
    results = []
    for record, runner in pairs:
        started = time.perf_counter()
        entry = {"artifact": record.name, "runtime": runner.runtime, "io": runner.io}
        entry.update(
            check(
                runner, batches, want, recipe, tolerance_for(recipe, record.precision), mask_name, per_token
            )
        )
        entry["seconds"] = round(time.perf_counter() - started, 1)
        results.append(entry)
        if args.out:  # after every pair: a run cut short keeps what it found
            report = {"masked_outputs": sorted(per_token), "results": results}
            args.out.write_text(json.dumps(report, indent=2) + "\n")
        outs = " ".join(
            f"{n} cos {v['cosine']:.5f} max_abs {v['max_abs']:.3g}"
            for n, v in entry.get("outputs", {}).items()
        )
        verdict = "PASS" if entry["passed"] else "FAIL"
        print(
            f"{verdict} {record.name:20} {runner.runtime:32} {runner.io:6} {outs} {entry.get('error', '')}"
            f" ({entry['seconds']} s)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
