"""The server scenario's parts on real things: the recipe's requests (MiniLM's tokenizer pads them), a dynamic
batcher on real threads, and MLPerf LoadGen driving a real ONNX Runtime session. No timing is asserted: what the
runs measure is a measurement, not a test."""

from __future__ import annotations

import functools
import os
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

pytest.importorskip("mlperf_loadgen", reason="the load extra: pip install 'deploy-pipeline[load]'")

from pipeline.bench.load.batcher import DynamicBatcher
from pipeline.bench.load.buckets import ShapeBuckets
from pipeline.bench.load.loadgen_run import (
    SUMMARY,
    RunSettings,
    ServerRun,
    in_process,
    read_detail,
    server_run,
)
from pipeline.bench.load.requests import RequestPool
from pipeline.bench.load.search import Confirmation, search
from pipeline.recipe.loader import load
from tests.stage_env import StageEnv
from tests.unit.stages.onnx_fixtures import TINY

RECIPES = Path(__file__).resolve().parents[3] / "recipes"


@pytest.fixture(scope="module")
def minilm(tmp_path_factory: pytest.TempPathFactory) -> StageEnv:
    return StageEnv(load(RECIPES / "bert.yaml").recipe, RECIPES, tmp_path_factory.mktemp("minilm"))


def test_text_requests_batch_as_the_tokenizer_pads_them(minilm: StageEnv) -> None:
    """Two sentences of different lengths, batched by the pool, equal the tokenizer's own padded batch."""
    dataset = minilm.dataset()
    pool = RequestPool.from_dataset(dataset)
    lengths = [s["input_ids"].shape[1] for s in pool.samples]
    short, long = int(np.argmin(lengths)), int(np.argmax(lengths))
    assert lengths[short] < lengths[long] and pool.batchable
    texts = [dataset.items[dataset.validation_index[i]] for i in (short, long)]
    expected = dataset._tokenize(texts, length=None)
    batch = pool.collate([short, long])
    assert set(batch) == set(expected)
    for name in expected:
        np.testing.assert_array_equal(batch[name], expected[name])


def test_bucket_shapes_double_up_to_the_largest_batch_and_the_longest_request() -> None:
    buckets = ShapeBuckets.powers(max_batch=24, longest=50, step=16, shortest=1, limit=128)
    assert buckets.batches == (1, 2, 4, 8, 16, 24) and buckets.lengths == (16, 32, 50)
    assert (buckets.batch_for(3), buckets.batch_for(24), buckets.length_for(33)) == (4, 24, 50)
    assert len(buckets) == len(buckets.shapes()) == 18
    with pytest.raises(ValueError, match="beyond the largest bucket"):
        buckets.batch_for(25)
    assert ShapeBuckets.powers(8, longest=500, step=16, limit=128).lengths == (16, 32, 64, 128)
    assert ShapeBuckets.powers(8, longest=None, step=16).lengths is None


def test_bucketed_text_batches_keep_every_real_row_and_reach_the_model_only_in_bucket_shapes(
    minilm: StageEnv,
) -> None:
    pool = RequestPool.from_dataset(minilm.dataset())
    buckets = ShapeBuckets.powers(4, pool.longest(), step=16, shortest=8, limit=256)
    lengths = [s["input_ids"].shape[1] for s in pool.samples]
    picked = [int(np.argmin(lengths)), int(np.argmax(lengths)), 0]
    plain, padded = pool.collate(picked), pool.collate(picked, buckets)
    width = plain["input_ids"].shape[1]
    assert padded["input_ids"].shape == (4, buckets.length_for(width))
    for name in plain:  # the real rows as the tokenizer padded them, then more padding; the extra row repeats
        np.testing.assert_array_equal(padded[name][:3, :width], plain[name])
        assert (padded[name][:3, width:] == (pool.pad or {}).get(name, 0)).all()
        np.testing.assert_array_equal(padded[name][3], padded[name][0])
    assert {tuple(f["input_ids"].shape) for f in pool.bucket_feeds(buckets)} == set(buckets.shapes())
    seen = _bucketed_shapes(pool, buckets, None, 11)
    assert seen and set(seen) <= set(buckets.shapes())


def _bucketed_shapes(
    pool: RequestPool, buckets: ShapeBuckets, key: object, requests: int
) -> list[tuple[int, ...]]:
    """The input_ids shapes a real batcher hands the model for `requests` requests padded to `buckets` (every
    request answered, no error)."""
    seen, answered = [], []
    batcher = DynamicBatcher(
        lambda feeds: seen.append(feeds["input_ids"].shape),
        functools.partial(pool.collate, buckets=buckets),
        key,
        answered.extend,
        buckets.batches[-1],
        max_delay_s=0.002,
    )
    batcher.submit([(i, i % len(pool)) for i in range(requests)])
    batcher.close()
    assert sorted(answered) == list(range(requests)) and batcher.error is None
    return seen


def test_requests_that_cannot_be_padded_reach_the_model_only_in_shapes_captured_before_the_run(
    tmp_path: Path,
) -> None:
    """Synthetic token ids have no tokenizer to pad them: requests of each length batch only with their own
    length, so a CUDA-graph runtime must capture every length at every bucket batch before LoadGen starts."""
    ctx = StageEnv(load(TINY, []).recipe, TINY.parent, tmp_path)
    pool = RequestPool.from_dataset(ctx.dataset())
    lengths = {s["input_ids"].shape[1] for s in pool.samples}
    assert pool.pad is None and len(lengths) > 1  # the case: several lengths, none paddable
    buckets = ShapeBuckets.powers(4, pool.longest(), step=16)
    warm = {tuple(f["input_ids"].shape) for f in pool.bucket_feeds(buckets)}
    assert warm == {(b, n) for b in buckets.batches for n in lengths}
    seen = _bucketed_shapes(pool, buckets, pool.key, 23)
    assert seen and set(seen) <= warm


class Recorder:
    """A model that records the batches it is given (real threads call it)."""

    def __init__(self, fail: bool = False):
        self.shapes: list[tuple[int, ...]] = []
        self.fail = fail

    def __call__(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.shapes.append(feeds["x"].shape)
        if self.fail:
            raise RuntimeError("the model broke")
        time.sleep(0.002)
        return feeds


def _batcher(model: Recorder, pool: RequestPool, answered: list[int], max_batch: int = 4) -> DynamicBatcher:
    lock = threading.Lock()

    def answer(queries: list[int]) -> None:
        with lock:
            answered.extend(queries)

    return DynamicBatcher(model, pool.collate, pool.key, answer, max_batch, max_delay_s=0.005)


def test_the_batcher_answers_every_request_in_batches_of_one_shape() -> None:
    pool = RequestPool([{"x": np.zeros((1, 4 if i % 2 else 8), np.float32)} for i in range(10)], None)
    model, answered = Recorder(), []
    batcher = _batcher(model, pool, answered)
    batcher.submit([(100 + i, i) for i in range(10)])
    batcher.submit([(200 + i, i) for i in range(10)])
    batcher.close()
    assert sorted(answered) == sorted([100 + i for i in range(10)] + [200 + i for i in range(10)])
    assert all(shape[0] <= 4 and shape[1] in (4, 8) for shape in model.shapes)
    assert sum(shape[0] for shape in model.shapes) == 20 and batcher.mean_batch and batcher.mean_batch > 1
    assert batcher.error is None


def test_a_model_that_raises_is_answered_and_its_error_kept() -> None:
    pool = RequestPool([{"x": np.zeros((1, 4), np.float32)} for _ in range(3)], None)
    model, answered = Recorder(fail=True), []
    batcher = _batcher(model, pool, answered)
    batcher.submit([(i, i) for i in range(3)])
    batcher.close()
    assert sorted(answered) == [0, 1, 2]
    assert batcher.error == "RuntimeError: the model broke"


class OrtRunner:
    """A real ONNX Runtime session behind the runner's infer()."""

    def __init__(self, path: Path):
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"y": self.session.run(None, feeds)[0]}


@pytest.fixture(scope="module")
def matmul(tmp_path_factory: pytest.TempPathFactory) -> OrtRunner:
    weights = np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 32])],
        [helper.make_tensor("w", TensorProto.FLOAT, weights.shape, weights.ravel())],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path_factory.mktemp("mm") / "mm.onnx"
    onnx.save(model, path)
    return OrtRunner(path)


def test_loadgen_drives_a_real_session_and_its_logs_are_read(matmul: OrtRunner, tmp_path: Path) -> None:
    pool = RequestPool([{"x": np.ones((1, 32), np.float32) * i} for i in range(16)], None)
    settings = RunSettings(p99_ms=50.0, run_s=0.3, max_batch=4, max_delay_s=0.001)
    run = server_run(in_process(matmul, pool, settings), pool, 200.0, settings, tmp_path / "run", seed=3)
    assert run.error is None and run.queries > 10 and run.completed_qps and run.completed_qps > 0
    assert run.p50_ms is not None and run.p99_ms is not None and run.p99_ms >= run.p50_ms > 0
    assert "Scenario : Server" in (tmp_path / "run" / SUMMARY).read_text()
    detail = read_detail(tmp_path / "run" / "mlperf_log_detail.txt")
    # LoadGen ran the settings asked for: the rate, the target, and this run's own arrival schedule
    assert detail["effective_target_qps"] == 200.0 and detail["effective_target_latency_ns"] == 50_000_000
    assert detail["effective_schedule_rng_seed"] == 3 and detail["effective_min_duration_ms"] == 300
    # the batcher's own clocks: every request of the run, its wait and its batch's call, each below the p99's
    # worst and together about LoadGen's mean (the answer's hand-back is all they leave out)
    split = run.time_split
    assert (
        split is not None
        and split["requests"] == run.queries
        and split["mean_batch"] == round(run.mean_batch, 2)
    )
    assert split["queue_ms"] >= 0 and 0 < split["runner_ms"] <= run.p99_ms * 4, split
    assert run.to_json()["time_split"] == split


def test_every_run_of_a_candidate_calls_its_runner_on_the_thread_its_warm_up_ran_on(
    matmul: OrtRunner, tmp_path: Path
) -> None:
    """A runtime may keep state per calling thread (ONNX Runtime's CUDA provider makes its cuBLAS and cuDNN
    handles on a thread's first call): a new batcher thread per LoadGen run made each run's first request pay
    that, 63 ms a call for the optimized FP16 MiniLM graph on an H100. The warm-up and every run share one
    thread now."""
    import threading

    from pipeline.bench.load.serving_thread import ServingThread

    callers: list[int] = []

    class Recorded:  # the real session, with the thread of each call noted
        def infer(self, feeds):  # noqa: ANN001, ANN202
            callers.append(threading.get_ident())
            return matmul.infer(feeds)

    pool = RequestPool([{"x": np.ones((1, 32), np.float32) * i} for i in range(16)], None)
    settings = RunSettings(p99_ms=50.0, run_s=0.2, max_batch=4, max_delay_s=0.001)
    serving = ServingThread()
    try:
        serving.call(Recorded().infer, pool.samples[0])
        for seed in (1, 2):
            connect = in_process(Recorded(), pool, settings, thread=serving)  # type: ignore[arg-type]
            run = server_run(connect, pool, 100.0, settings, tmp_path / f"run{seed}", seed=seed)
            assert run.error is None and run.queries > 5
    finally:
        serving.stop()
    assert len(callers) > 10 and set(callers) == {serving.ident}
    assert serving.ident != threading.get_ident()


def test_a_serving_thread_outlives_a_job_that_raised() -> None:
    """One failed run (its answer callback raising) must not leave the next runs' batchers with no thread to
    run them: they would wait until LoadGen's bound and stop every later load run."""
    import threading

    from pipeline.bench.load.serving_thread import ServingThread

    serving = ServingThread()
    try:

        def fails() -> None:
            raise RuntimeError("a run's own failure")

        serving.start(fails)
        ran = threading.Event()
        serving.start(ran.set)
        assert ran.wait(5.0), "the serving thread died with the failed job"
    finally:
        serving.stop(timeout_s=5.0)


def _run(qps: float, p99: float) -> ServerRun:
    return ServerRun(qps, qps * 0.99, p99 / 2, p99, int(qps), True, False, None, 1.0, None, 0.1, "")


def _synthetic(knee: float):
    """A candidate whose p99 crosses 10 ms at `knee` requests/s: the search's logic on its own, away from any
    machine's noise."""
    calls: list[float] = []

    def run_at(qps: float) -> ServerRun:
        calls.append(qps)
        return _run(qps, 5.0 * qps / knee)

    return run_at, calls


def test_the_rate_search_brackets_the_knee_and_confirms_it() -> None:
    run_at, calls = _synthetic(knee=400.0)
    found = search(run_at, 100.0, p99_ms=10.0, runs=10, repeats=3)
    assert found.rate is not None and 400.0 / 1.15 < found.rate <= 400.0 * 2
    assert calls[:3] == [100.0, 200.0, 400.0]  # doubling while it passes
    assert [r.target_qps for r in found.repeats] == [found.rate] * 3
    served = found.served()
    assert (
        served is not None and served["held"] == 3 and served["ci95"][0] <= served["qps"] <= served["ci95"][1]
    )
    assert found.miss() is None


def test_a_candidate_that_never_meets_the_target_says_by_how_much() -> None:
    run_at, _ = _synthetic(knee=1.0)
    found = search(run_at, 100.0, p99_ms=10.0, runs=4, repeats=2)
    assert found.rate is None and found.served() is None and not found.repeats
    assert found.miss() == "p99 62.5 ms at 12.5 requests/s, the lowest rate tried: 6.25× the 10 ms target"


def test_a_rate_that_does_not_hold_when_run_again_gives_way_to_a_lower_one() -> None:
    """The search passes up to 800 requests/s, but above 650 a rate misses whenever it is run again: 800 is not
    confirmed, and the next rate that passed in the search, 400, is."""
    calls: list[float] = []

    def run_at(qps: float) -> ServerRun:
        again = qps in calls
        calls.append(qps)
        return _run(qps, 5.0 * qps / 400.0 * (4 if again and qps > 650 else 1))

    found = search(run_at, 100.0, p99_ms=10.0, runs=10, repeats=3)
    assert found.rate == 400.0 and [r.target_qps for r in found.repeats] == [400.0] * 3
    assert found.tried == [Confirmation(800.0, 0, 3)]


def test_when_no_rate_holds_again_the_miss_names_the_rates_tried() -> None:
    calls: list[float] = []

    def run_at(qps: float) -> ServerRun:
        again = qps in calls
        calls.append(qps)
        return _run(qps, 50.0 if again else 1.0)  # every rate passes once, never again

    found = search(run_at, 100.0, p99_ms=10.0, runs=3, repeats=1)
    assert found.rate is None and found.served() is None and found.bounded
    assert found.miss() == (
        "no rate held the target in most of its runs again (400 requests/s held 0 of 1, 200 requests/s held "
        "0 of 1, 100 requests/s held 0 of 1)"
    )


def test_loadgen_through_a_real_triton_server(matmul: OrtRunner, tmp_path: Path) -> None:
    """benchmark.server.through: triton. The same session behind a Triton server (PyTriton) started here; LoadGen's
    requests go over gRPC and every one is answered by the server."""
    pytest.importorskip("pytriton", reason="the serve extra: pip install 'deploy-pipeline[serve]'")
    from pipeline.bench.load.triton_target import TritonTarget
    from pipeline.release.triton_server import HOST, Batching, Ports, triton_serving

    pool = RequestPool([{"x": np.ones((1, 32), np.float32) * i} for i in range(16)], None)
    settings = RunSettings(p99_ms=500.0, run_s=0.5, max_batch=4, max_delay_s=0.001)
    sample = pool.samples[0]
    ports = Ports.free()
    libraries = os.environ.get("LD_LIBRARY_PATH")
    with triton_serving("mm", matmul, sample, matmul.infer(sample), Batching(4, 1.0), ports) as running:
        url = f"{HOST}:{ports.grpc}"
        connect = lambda answer: TritonTarget(url, "mm", running.counters, pool, answer)  # noqa: E731
        run = server_run(connect, pool, 50.0, settings, tmp_path / "run", seed=1)
        assert running.alive()
    assert os.environ.get("LD_LIBRARY_PATH") == libraries  # the server's libraries were its own
    assert run.error is None and run.queries > 5 and run.completed_qps and run.p99_ms and run.p99_ms > 0
    assert read_detail(tmp_path / "run" / "mlperf_log_detail.txt")["result_query_count"] == run.queries
    # Triton's own counters say where the requests' time went: every request of the run, in its steps
    split = run.time_split
    assert split is not None and split["requests"] == run.queries, split
    assert 1.0 <= split["mean_batch"] <= 4.0 and run.mean_batch == split["mean_batch"]
    assert 0 < split["runner_ms"] < split["compute_infer_ms"] < split["server_ms"], split
    assert split["queue_ms"] + split["compute_infer_ms"] <= split["server_ms"] + 0.01, split
    assert run.to_json()["time_split"] == split
    # the sign-off's sentence for the row: the same steps, with the runner's share and the hand-off's
    from pipeline.check.served import ServedRate
    from pipeline.check.speed import fmt_ms, fmt_qps
    from pipeline.report.load import _split_sentence

    record = {"artifact": "mm", "runtime": "onnxruntime-cpu", "through": "triton", "runs": [run.to_json()]}
    row = ServedRate.read(record)
    sentence = _split_sentence(row) or ""
    assert sentence.startswith(
        f"Inside the server, for mm (onnxruntime-cpu) at {fmt_qps(50.0)} requests/s"
    ), sentence
    assert f"{fmt_ms(split['runner_ms'])} ms in the runner itself" in sentence, sentence
    assert "hand-off to the deploy's process and back" in sentence and "LoadGen's p50" in sentence
    assert not running.log.parent.exists()  # a server that stopped cleanly leaves nothing behind


def test_a_triton_server_that_dies_mid_run_fails_the_run_with_the_reason(
    matmul: OrtRunner, tmp_path: Path
) -> None:
    """The server is killed while LoadGen issues requests: the run still ends within its bound, and it fails
    with Triton's error, not a hang and not a figure."""
    pytest.importorskip("pytriton", reason="the serve extra: pip install 'deploy-pipeline[serve]'")
    import os
    import signal
    import subprocess
    import threading
    import time

    from pipeline.bench.load.triton_target import TritonTarget
    from pipeline.release.triton_server import HOST, Batching, Ports, triton_serving

    def kill_server() -> None:
        time.sleep(0.4)
        out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
        for line in out.splitlines()[1:]:
            if "tritonserver" in line and str(running.log.parent) in line:
                os.kill(int(line.split()[0]), signal.SIGKILL)

    pool = RequestPool([{"x": np.ones((1, 32), np.float32) * i} for i in range(16)], None)
    settings = RunSettings(p99_ms=500.0, run_s=1.5, max_batch=4, max_delay_s=0.001)
    sample = pool.samples[0]
    ports = Ports.free()
    started = time.monotonic()
    with triton_serving("mm", matmul, sample, matmul.infer(sample), Batching(4, 1.0), ports) as running:
        killer = threading.Thread(target=kill_server)
        killer.start()
        url = f"{HOST}:{ports.grpc}"
        connect = lambda answer: TritonTarget(url, "mm", running.counters, pool, answer)  # noqa: E731
        run = server_run(connect, pool, 50.0, settings, tmp_path / "run", seed=1)
        killer.join()
        assert not running.alive()
    assert run.error is not None and run.error.startswith("Triton answered with an error"), run.error
    assert not run.meets(500.0)
    assert time.monotonic() - started < 60
