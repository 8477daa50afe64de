from __future__ import annotations

import re
from html.parser import HTMLParser

from pipeline.report.html import render_html
from tests.unit.report import samples


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)

    def handle_data(self, data):
        self.text.append(data)


def test_html_escapes_errors_and_reasons(inputs):
    inputs["stages"][4]["error"] = "bad <script>alert(1)</script> & more"
    page = render_html(**inputs)
    assert "<script>" not in page
    assert "bad &lt;script&gt;alert(1)&lt;/script&gt; &amp; more" in page
    assert "cudaError 35 &lt;driver&gt;" in page
    parser = _Tags()
    parser.feed(page)
    assert "script" not in parser.tags
    assert "bad <script>alert(1)</script> & more" in "".join(parser.text)  # reads back as written


def test_html_is_self_contained_with_relative_plots(inputs):
    page = render_html(**inputs, plots=["reports/latency.png", "reports/accuracy.png"])
    assert page.startswith("<!DOCTYPE html>")
    assert "<style>" in page
    assert not re.search(r"(src|href)=\"(https?:)?//", page)
    assert '<img src="latency.png"' in page and '<img src="accuracy.png"' in page


def test_html_carries_the_same_story(inputs):
    page = render_html(**inputs, previous=samples.previous())
    assert '<span class="verdict good">SIGNED OFF</span>' in page
    assert "onnx-int8-dynamic on onnxruntime-cpu (host I/O): 10.8 ms" in page
    assert '<tr class="winner"><td>onnx-int8-dynamic ★</td>' in page
    assert '<tr class="bad"><td>onnx-int8</td>' in page
    assert '<tr class="warn"><td>onnx-fp16</td>' in page  # the unstable row
    assert "no TensorRT-RTX runtime for this machine" in page
    assert "Changes since v0002" in page
    assert "onnx-fp32 batch 1 p50 34.7 -&gt; 31.6 ms (-9%)" in page


def test_not_signed_off_banner(inputs):
    inputs["header"] = samples.header(signed_off=False)
    page = render_html(**inputs | {"winner": None})
    assert '<span class="verdict bad">NOT SIGNED OFF</span>' in page
    assert "<li>no artifact passed validation</li>" in page


def test_same_inputs_same_bytes(inputs):
    assert render_html(**inputs).encode() == render_html(**inputs).encode()


def test_informational_misses_are_grey_and_never_a_red_cross(inputs):
    page = render_html(**inputs)
    assert '<td class="info">0.061 &gt; 0.05 (info)</td>' in page
    assert '<td class="bad">0.971200 &lt; 0.98 ✗</td>' in page
    fp16 = page[page.index("<tr><td>onnx-fp16</td>") :].split("</tr>")[0]
    assert "✗" not in fp16


def test_the_record_is_folded_and_tables_do_not_overflow(inputs):
    page = render_html(**inputs)
    assert "<details>\n<summary>Artifacts</summary>" in page and "<summary>Conditions</summary>" in page
    assert page.count('<div class="scroll"><table>') == page.count("<table>")
