"""A tool's message quoted in a report carries no terminal colour codes (torch.export colours its steps)."""

from __future__ import annotations

from pipeline.core.errors import one_line, plain


def test_terminal_colour_codes_are_dropped_from_quoted_messages() -> None:
    message = "\x1b[96mThis is step 1/3\x1b[0m of exporting the model to ONNX\nNext steps"
    assert plain(message) == "This is step 1/3 of exporting the model to ONNX\nNext steps"
    assert one_line(message) == "This is step 1/3 of exporting the model to ONNX\\nNext steps"


def test_onnx_runtime_cuda_failures_are_quoted_by_their_reason_not_their_cxx_throw_sites() -> None:
    """The H200 zoo's recurrent tagger failed on ONNX Runtime's CUDA graphs, and every report line stopped at
    'std::conditional_t<THRW, void, …': the C++ throw sites came before the reason."""
    site = (
        "/onnxruntime_src/onnxruntime/core/providers/cuda/cuda_call.cc:{line} std::conditional_t<THRW, void, "
        "onnxruntime::common::Status> onnxruntime::CudaCall(ERRTYPE, const char*, const char*, SUCCTYPE, const "
        "char*, const char*, int) [with ERRTYPE = cudaError; bool THRW = true; SUCCTYPE = cudaError; "
        "std::conditional_t<THRW, void, common::Status> = void] "
    )
    message = (
        "Error in execution: "
        + site.format(line=154)
        + site.format(line=146)
        + "CUDA failure 900: operation not "
        "permitted when stream is capturing ; GPU=0 ; hostname=gpu-7 ; file=/onnxruntime_src/onnxruntime/core/"
        "providers/cuda/rnn/cudnn_rnn_base.cc ; line=341 ; expr=cudaMemcpyAsync(a, b, n, kind, stream); "
    )
    assert plain(message) == (
        "Error in execution: CUDA failure 900: operation not permitted when stream is capturing; "
        "expr=cudaMemcpyAsync(a, b, n, kind, stream); "
    )
