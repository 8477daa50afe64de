"""Hand-tuned peers for torchvision ResNet-50 on a GPU host, set beside the GPU zoo's own ResNet-50 rows in the
same sitting (issue 26 asks for the peers' figures from the same sitting as speed.json's), with the levers a
practitioner would try one at a time, so the next change to the pipeline is chosen by measurement.

- torch: the model in FP16, channels-last, torch.compile per batch shape (static), one CUDA graph per batch
  (the issue's peer: "torch.compile reduce-overhead, FP16, channels_last"); then the same with cuDNN's
  autotuning (cudnn.benchmark, which the pipeline's torch rows now run with), with Inductor's freezing (batch
  norm folded into the convolutions), and with 1x1 convolutions as matrix multiplies.
- ONNX Runtime (with --onnx, the zoo's FP16 graph): the CUDA provider in a CUDA graph, NCHW and with the
  provider's NHWC kernels (prefer_nhwc).

Random weights (seeded) and random images: speed does not depend on them. Prints p50 ms per peer and batch.
Usage, on the GPU host after staging: python3 scripts/gpu_cnn_peers.py [--onnx model.fp16.onnx] 1 32 256
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np
import torch
from gpu_peers import graphed_p50_ms

# name: (cudnn.benchmark, Inductor options, batches: None = every batch asked for)
LEVERS: dict[str, tuple[bool, dict[str, Any], tuple[int, ...] | None]] = {
    "peer (compile + graph)": (False, {}, None),
    "+ cudnn.benchmark": (True, {}, None),
    "+ cudnn.benchmark + freezing": (True, {"freezing": True}, (1, 256)),
    "+ cudnn.benchmark + freezing + 1x1 as mm": (True, {"freezing": True, "conv_1x1_as_mm": True}, (1, 256)),
}


def torch_peers(batches: list[int]) -> None:
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet50().to("cuda", torch.float16).eval()
    model = model.to(memory_format=torch.channels_last)
    for name, (benchmark, options, only) in LEVERS.items():
        torch.backends.cudnn.benchmark = benchmark
        torch._dynamo.reset()
        compiled = torch.compile(model, dynamic=False, options=options or None)
        for batch in [b for b in batches if only is None or b in only]:
            images = torch.randn(batch, 3, 224, 224, device="cuda", dtype=torch.float16)
            images = images.contiguous(memory_format=torch.channels_last)
            ms, seconds = graphed_p50_ms(lambda x=images, f=compiled: f(x))
            print(f"torch {name}, batch {batch}: {ms:.3f} ms (compile and capture {seconds:.0f} s)")


def onnxruntime_peers(path: str, batches: list[int]) -> None:
    import onnxruntime as ort

    for nhwc in ("0", "1"):
        for batch in batches:
            options = {"enable_cuda_graph": "1", "prefer_nhwc": nhwc}
            try:
                session = ort.InferenceSession(path, providers=[("CUDAExecutionProvider", options)])
            except Exception as error:  # noqa: BLE001 - an ONNX Runtime build without the option says so
                print(f"onnxruntime prefer_nhwc={nhwc}: {type(error).__name__}: {error}")
                return
            source, target = session.get_inputs()[0], session.get_outputs()[0]
            dtype = np.float16 if "float16" in source.type else np.float32
            images = np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(dtype)
            binding = session.io_binding()
            binding.bind_ortvalue_input(source.name, ort.OrtValue.ortvalue_from_numpy(images, "cuda", 0))
            binding.bind_output(target.name, "cuda")
            session.run_with_iobinding(binding)  # captures the graph
            times = []
            for _ in range(55):
                started = time.perf_counter()
                session.run_with_iobinding(binding)
                times.append((time.perf_counter() - started) * 1e3)
            print(
                f"onnxruntime CUDA graph prefer_nhwc={nhwc}, batch {batch}: {statistics.median(times[5:]):.3f} ms"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--onnx", help="the zoo's ResNet-50 FP16 ONNX graph (model.fp16.onnx)")
    parser.add_argument("batches", nargs="*", type=int, default=[1, 32, 256])
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}")
    if args.onnx:
        onnxruntime_peers(args.onnx, args.batches)
    torch_peers(args.batches)


if __name__ == "__main__":
    main()
