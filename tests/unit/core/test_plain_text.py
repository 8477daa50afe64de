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


def test_a_torchscript_interpreter_error_is_reported_by_its_reason_not_its_wrapper_line() -> None:
    """TorchScript's first line only says that an operation failed; the reason is the message's last line."""
    from pipeline.core.errors import first_line

    message = (
        "RuntimeError: The following operation failed in the TorchScript interpreter.\n"
        'Traceback of TorchScript (most recent call last):\n  File "<string>", line 3\n'
        "RuntimeError: select(): index 4 out of range for tensor of size [4, 1, 64] at dimension 0"
    )
    assert first_line(message) == (
        "RuntimeError in the TorchScript interpreter: RuntimeError: select(): index 4 out of range for tensor of "
        "size [4, 1, 64] at dimension 0"
    )
    assert first_line("ValueError: bad\nmore") == "ValueError: bad" and first_line(None) == ""
    # a first line of only the type (TorchScript's export of BLOOM's GeLU function): the message is next
    assert first_line("RuntimeError:\nCould not export Python function call 'GeLUFunction'\n  at x.py") == (
        "RuntimeError: Could not export Python function call 'GeLUFunction'"
    )


def test_an_exception_without_a_message_is_named_by_where_it_was_raised() -> None:
    """ONNX Runtime's optimizer asserted without a message (no attention heads): 'AssertionError: ' said nothing."""
    from pipeline.stages.optimize_onnx import first_line

    try:
        raise AssertionError  # as a bare `assert` in a tool raises it (pytest rewrites this file's asserts)
    except AssertionError as exc:
        text = first_line(exc)
    assert (
        text.startswith("raised without a message at test_plain_text.py:") and "raise AssertionError" in text
    )


def test_quoting_onnx_runtime_keeps_the_reason_on_the_next_line_and_text_that_only_looks_like_a_frame() -> (
    None
):
    """The clean-up of ONNX Runtime's messages removes its throw sites and source fields, never a reason."""
    fields = "CUDA failure 2: out of memory ; GPU=0 ; hostname=h ; file=a.cc ; line=129\nthe real reason"
    assert plain(fields) == "CUDA failure 2: out of memory\nthe real reason"
    frame = "/onnxruntime_src/a.cc:10 void f() Got invalid dimensions for input [with index 0]: expected 3"
    assert plain(frame) == "void f() Got invalid dimensions for input [with index 0]: expected 3"


def test_a_torchscript_wrapper_line_without_a_type_reads_cleanly() -> None:
    from pipeline.core.errors import first_line

    text = (
        "The following operation failed in the TorchScript interpreter.\nTraceback…\nRuntimeError: bad index"
    )
    assert first_line(text) == "in the TorchScript interpreter: RuntimeError: bad index"
