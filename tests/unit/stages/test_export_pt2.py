"""torch.export and AOTInductor artifacts of the tiny encoder on the CPU (one AOTInductor compile for the whole
module), and their runners: eager, padding-aware and AOTInductor, checked against the eager reference."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.core.artifacts import ArtifactRecord
from pipeline.run.plan import needed_variants, plan_stages
from pipeline.runners.base import NotRunnable
from pipeline.runners.registry import runners_for
from pipeline.stages import export_pt2
from tests.stage_env import StageEnv
from tests.unit.stages.onnx_fixtures import lowest_cosine, tiny_context

PT2 = ["exported-fp32", "exported-fp16", "exported-bf16", "aoti-fp32", "aoti-fp16", "aoti-bf16"]
PADDING = "runtime.padding={per_token_outputs: [hidden], multiple: 4, group_overhead_tokens: 0}"


def _record(ctx: StageEnv, out) -> ArtifactRecord:
    path = ctx.workdir / out.path
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return ArtifactRecord(out.artifact, path, out.kind, out.precision, digest, "test", dict(out.details))


def _run(ctx: StageEnv, name: str, inputs: dict[str, ArtifactRecord] | None = None) -> ArtifactRecord:
    return _record(ctx, ctx.run_named(name, inputs, variants=PT2).outputs[0])


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory) -> StageEnv:
    return tiny_context(tmp_path_factory.mktemp("pt2"), PADDING, "benchmark.intra_op_threads=1")


@pytest.fixture(scope="module")
def exported(ctx: StageEnv) -> ArtifactRecord:
    return _run(ctx, "export_pt2_fp32")


@pytest.fixture(scope="module")
def aoti(ctx: StageEnv, exported: ArtifactRecord) -> ArtifactRecord:
    return _run(ctx, "aoti_fp32", {"exported-fp32": exported})


def _padded_feeds(ctx: StageEnv) -> tuple[dict[str, np.ndarray], np.ndarray]:
    feeds = ctx.dataset().feeds_at({"batch": 4, "sequence": 20})
    real = np.array([20, 5, 11, 7])
    mask = (np.arange(20)[None, :] < real[:, None]).astype(feeds["attention_mask"].dtype)
    return {**feeds, "attention_mask": mask}, mask.astype(bool)


def _reference(ctx: StageEnv, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    with torch.no_grad():
        out = ctx.model().module(*(torch.from_numpy(feeds[s.name]) for s in ctx.recipe.inputs))
    return {name: t.numpy() for name, t in zip(ctx.recipe.outputs, out, strict=True)}


def test_stages_and_plan(ctx: StageEnv) -> None:
    stages = {name: ctx.stage(name, PT2) for name in ("aoti_fp16", "export_pt2_bf16")}
    assert stages["aoti_fp16"].consumes == ("exported-fp16",)
    assert stages["export_pt2_bf16"].produces == ("exported-bf16",)
    recipe = ctx.recipe.model_copy(
        update={"variants": ctx.recipe.variants.model_copy(update={"build": ["onnx-fp32", "aoti-fp16"]})}
    )
    assert [v.name for v in needed_variants(recipe)] == ["onnx-fp32", "exported-fp16", "aoti-fp16"]
    names = [s.name for s in plan_stages(recipe, ctx.recipe_dir)]
    assert names.index("export_pt2_fp16") < names.index("aoti_fp16") < names.index("validate")


def test_exported_program(exported: ArtifactRecord) -> None:
    assert (exported.name, exported.kind, exported.precision) == ("exported-fp32", "exported", "fp32")
    assert exported.path.name == "model.exported.pt2"
    assert exported.details["attention"] == "model's own"  # not a transformers model
    assert exported.details["dims"] == {"batch": [1, 8], "sequence": [4, 32]}
    # each layer's query, key and value projections read one tensor: one GEMM per layer instead of three
    assert exported.details["fused_projections"] == 2, exported.details
    program = torch.export.load(str(exported.path))
    linears = [n for n in program.graph.nodes if n.target == torch.ops.aten.linear.default]
    assert len(linears) == 2 * (1 + 1 + 2)  # per layer: fused QKV, attention output, two feed-forward


def test_exported_runners_match_the_reference(ctx: StageEnv, exported: ArtifactRecord) -> None:
    runners = runners_for(exported, ctx.settings)
    assert [r.runtime for r in runners] == ["torch-cpu", "torch-cpu-bucketed"]
    feeds, real = _padded_feeds(ctx)
    want = _reference(ctx, feeds)
    for runner in runners:
        runner.activate()
        try:
            got = runner.infer(feeds)
            runner.prepare(feeds)
            runner.infer_prepared()
        finally:
            runner.deactivate()
        assert np.abs(got["hidden"][real] - want["hidden"][real]).max() < 1e-5, runner.runtime
        assert np.abs(got["pooled"] - want["pooled"]).max() < 1e-5
    assert runners[1].details["padding"]["computed_tokens"] < 4 * 20  # prepare() recorded the plan
    assert list(runners[1].details["prepare_s"]) == ["4x20"]


def test_a_torch_compile_runtime_compiles_once_per_process(exported: ArtifactRecord) -> None:
    """Validation and every benchmarked shape activate a runner of their own: the later ones take the module
    the first compiled, until the benchmark releases them all (torch.compile is lazy: nothing runs here)."""
    from pipeline.runners.compiled import release_all
    from pipeline.runners.loaders import ExportedProgramFromPath
    from pipeline.runners.pt2 import Pt2Runner

    def runner() -> Pt2Runner:
        load = ExportedProgramFromPath(exported.path, "cpu")
        return Pt2Runner(
            "exported-fp32",
            "torch-compile-cpu",
            load,
            ["ids", "mask"],
            ["hidden"],
            "cpu",
            "host",
            compile_mode="default",
        )

    release_all()
    seen = []
    for _ in range(2):
        r = runner()
        r.activate()
        seen.append((r._fn, r.details["compiled_before"], "resident_bytes" in r.details))
        r.deactivate()
    assert seen[1][0] is seen[0][0] and [s[1:] for s in seen] == [(False, False), (True, True)]
    release_all()
    r = runner()
    r.activate()
    assert r._fn is not seen[0][0] and not r.details["compiled_before"]
    r.deactivate()
    release_all()


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_lower_precision_keeps_float32_io(ctx: StageEnv, precision: str) -> None:
    program = torch.export.load(str(_run(ctx, f"export_pt2_{precision}").path))
    dtypes = {p.dtype for p in program.state_dict.values() if p.is_floating_point()}
    assert dtypes == {export_pt2.DTYPES[precision]}
    feeds = ctx.dataset().feeds_at({"batch": 2, "sequence": 16})
    with torch.no_grad():
        hidden, pooled = program.module()(*(torch.from_numpy(feeds[s.name]) for s in ctx.recipe.inputs))
    assert hidden.dtype == pooled.dtype == torch.float32
    assert lowest_cosine(pooled.numpy(), _reference(ctx, feeds)["pooled"]) > 0.99


def test_aoti_package_for_the_cpu(ctx: StageEnv, aoti: ArtifactRecord) -> None:
    assert (aoti.name, aoti.kind, aoti.path.name) == ("aoti-fp32", "aoti", "model.aoti.fp32.pt2")
    assert aoti.details["device"] == "cpu" and aoti.details["compile_s"] > 0
    (runner,) = runners_for(aoti, ctx.settings)
    assert (runner.runtime, runner.io) == ("torch-aoti-cpu", "host")
    runner.activate()
    try:
        for shape in ({"batch": 1, "sequence": 8}, {"batch": 3, "sequence": 24}):  # one package, any shape
            feeds = ctx.dataset().feeds_at(shape)
            got, want = runner.infer(feeds), _reference(ctx, feeds)
            assert np.abs(got["hidden"] - want["hidden"]).max() < 1e-4
    finally:
        runner.deactivate()


def test_cuda_package_is_not_runnable_without_a_gpu(ctx: StageEnv, aoti: ArtifactRecord) -> None:
    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    cuda = ArtifactRecord(
        aoti.name, aoti.path, "aoti", "fp32", aoti.sha256, "test", {"device": "cuda", "gpu": "H200"}
    )
    result = runners_for(cuda, ctx.settings)
    assert isinstance(result, NotRunnable) and "no CUDA GPU" in result.reason


def test_cuda_target_without_a_gpu_fails_clearly(tmp_path: Path, exported: ArtifactRecord) -> None:
    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    ctx = tiny_context(tmp_path, "export.pt2.device=cuda")
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        _run(ctx, "aoti_fp32", {"exported-fp32": exported})


def test_a_compile_that_raises_fails_its_variant_with_the_compilers_message(tmp_path: Path) -> None:
    ctx = tiny_context(tmp_path)
    broken = tmp_path / "model.exported.fp32.pt2"
    broken.write_bytes(b"not an ExportedProgram")
    record = ArtifactRecord("exported-fp32", broken, "exported", "fp32", "0" * 64, "test")
    with pytest.raises(RuntimeError, match=r"^AOTInductor compile failed: \w+") as caught:
        _run(ctx, "aoti_fp32", {"exported-fp32": record})
    assert "native crash" not in str(caught.value)
    assert "Traceback" in (ctx.workdir / "logs/aoti_fp32.log").read_text()  # the whole story, in the log


def test_a_gpu_package_skips_the_cpu_isa_probe() -> None:
    """Compiling or loading a GPU package must not spend the 40-50 s torch 2.11 takes to probe the CPU's vector
    ISA (a test build and a fresh Python per ISA); a CPU package keeps the probe. In a fresh Python, as the
    compile child and a server loading the package are: Inductor caches its answer for the process."""
    code = """
import subprocess
import torch._inductor.config as inductor_config
from torch._inductor.codecache import get_device_information
from torch._inductor.cpu_vec_isa import pick_vec_isa
from pipeline.toolchain.aoti import no_cpu_isa_probe

with no_cpu_isa_probe("cpu"):
    assert inductor_config.cpp.vec_isa_ok is None  # the CPU keeps Inductor's own answer
def no_subprocess(self, args, *rest, **kwargs):
    raise AssertionError(f"a probe ran: {args}")
subprocess.Popen.__init__ = no_subprocess
with no_cpu_isa_probe("cuda"):
    assert not pick_vec_isa()
    assert get_device_information("cpu")["AOTI_CPU_ISA"] == "INVALID_VEC_ISA"  # what the compile records
assert inductor_config.cpp.vec_isa_ok is None
print("no probe")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "no probe", done.stderr[-2000:]


# ------------------------------------------------------------------ convolutions in channels-last layout


@pytest.fixture(scope="module")
def cnn(tmp_path_factory: pytest.TempPathFactory) -> StageEnv:
    from pipeline.recipe import Recipe

    recipe = Recipe.model_validate(
        {
            "name": "cnn",
            "model": {"source": "entrypoint", "entrypoint": "tests.models.tiny:cnn"},
            "inputs": [{"name": "images", "dtype": "float32", "shape": ["batch", 3, 16, 16]}],
            "dims": {"batch": {"min": 1, "opt": 2, "max": 4}},
            "outputs": ["logits"],
            "data": {"samples": {"source": "random", "samples": 8}, "calibration": 4},
            "benchmark": {"batch_sizes": [2], "intra_op_threads": 1},
            "selection": {"objective": {"metric": "p50_ms", "batch": 2}},
        }
    )
    work = tmp_path_factory.mktemp("cnn")
    return StageEnv(recipe, work, work / "work")


def test_a_cnn_is_compiled_channels_last_and_still_takes_nchw(cnn: StageEnv) -> None:
    """A model with 2-D convolutions is exported NHWC (weights and the inputs, laid out inside the graph):
    its callers keep passing NCHW arrays, and the eager and AOTInductor runners match the reference."""
    exported = _record(cnn, cnn.run_named("export_pt2_fp32", None, variants=["exported-fp32"]).outputs[0])
    assert exported.details["memory_format"] == "channels_last"
    program = torch.export.load(str(exported.path))
    convs = [t for name, t in program.state_dict.items() if t.dim() == 4]
    assert convs and all(t.is_contiguous(memory_format=torch.channels_last) for t in convs)
    aoti = _record(
        cnn, cnn.run_named("aoti_fp32", {"exported-fp32": exported}, variants=["aoti-fp32"]).outputs[0]
    )
    feeds = cnn.dataset().feeds_at({"batch": 2})
    assert feeds["images"].flags["C_CONTIGUOUS"] and feeds["images"].shape == (2, 3, 16, 16)
    with torch.no_grad():
        out = cnn.model().module(torch.from_numpy(feeds["images"]))
    want = (out[0] if isinstance(out, tuple) else out).numpy()
    for artifact in (exported, aoti):
        runners = runners_for(artifact, cnn.settings)
        assert not isinstance(runners, NotRunnable)
        for runner in runners:
            runner.activate()
            try:
                got = runner.infer(feeds)["logits"]
            finally:
                runner.deactivate()
            assert np.allclose(got, want, atol=1e-4), (runner.label, np.abs(got - want).max())


def test_memory_format_contiguous_keeps_the_default_layout(cnn: StageEnv, tmp_path: Path) -> None:
    pt2 = cnn.recipe.export.pt2.model_copy(update={"memory_format": "contiguous"})
    recipe = cnn.recipe.model_copy(update={"export": cnn.recipe.export.model_copy(update={"pt2": pt2})})
    ctx = StageEnv(recipe, cnn.recipe_dir, tmp_path)
    out = ctx.run_named("export_pt2_fp32", None, variants=["exported-fp32"]).outputs[0]
    assert out.details["memory_format"] == "contiguous"
