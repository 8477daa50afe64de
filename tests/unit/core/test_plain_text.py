"""A tool's message quoted in a report carries no terminal colour codes (torch.export colours its steps)."""

from __future__ import annotations

from pipeline.core.errors import one_line, plain


def test_terminal_colour_codes_are_dropped_from_quoted_messages() -> None:
    message = "\x1b[96mThis is step 1/3\x1b[0m of exporting the model to ONNX\nNext steps"
    assert plain(message) == "This is step 1/3 of exporting the model to ONNX\nNext steps"
    assert one_line(message) == "This is step 1/3 of exporting the model to ONNX\\nNext steps"
