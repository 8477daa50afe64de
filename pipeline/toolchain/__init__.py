"""How artifacts are made: ONNX tools and graph checks, fusions, and the TensorRT and AOTInductor builds in child
processes."""
