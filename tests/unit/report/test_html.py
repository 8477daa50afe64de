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
    assert '<div class="card signed_off" id="decision">\n<div class="state">SIGNED OFF</div>' in page
    assert "onnx-int8-dynamic on onnxruntime-cpu (host I/O): 10.8 ms" in page
    assert '<tr class="winner"><td>onnx-int8-dynamic ★</td>' in page
    assert '<tr class="bad"><td><span class="id">onnx-int8</span></td>' in page  # identifiers never wrap
    assert '<tr class="warn"><td><span class="id">onnx-fp16</span></td>' in page  # the unstable row
    assert "no TensorRT-RTX runtime for this machine" in page
    assert "Changes since v0002" in page
    assert "onnx-fp32 batch 1 p50 34.7 -&gt; 31.6 ms (-9%)" in page


def test_not_signed_off_banner(inputs):
    inputs["header"] = samples.header(signed_off=False)
    page = render_html(**inputs | {"winner": None})
    assert '<div class="card not_signed_off" id="decision">' in page
    assert '<div class="state">NOT SIGNED OFF: nothing may be deployed from this version</div>' in page
    assert "<li>no artifact passed validation</li>" in page


def test_same_inputs_same_bytes(inputs):
    assert render_html(**inputs).encode() == render_html(**inputs).encode()


def test_informational_misses_are_grey_and_never_a_red_cross(inputs):
    page = render_html(**inputs)
    assert '<td class="info">0.061 &gt; 0.05 (info)</td>' in page
    assert '<td class="bad">0.971200 &lt; 0.98 ✗</td>' in page
    fp16 = page[page.index('<tr><td><span class="id">onnx-fp16</span></td>') :].split("</tr>")[0]
    assert "✗" not in fp16


def test_the_record_is_folded_and_tables_do_not_overflow(inputs):
    page = render_html(**inputs)
    assert "<details>\n<summary>Artifacts</summary>" in page and "<summary>Conditions</summary>" in page
    assert page.count('<div class="scroll"><table>') == page.count("<table>")


def _card(page: str) -> dict[str, str]:
    start = page.index('<div class="card')
    card = page[start : page.index("</dl>", start)]
    return dict(re.findall(r"<dt>(.*?)</dt><dd>(.*?)</dd>", card))


def test_the_first_screen_is_one_card_that_decides(inputs):
    """The card comes first, before any table: verdict, the file to ship and how to load it, the objective's
    figure with its interval, and the counts of validated, not run and failed."""
    page = render_html(**inputs)
    first = page.index('<div class="card')
    assert first < page.index("<table>") and first < page.index("<h2>Winner</h2>")
    facts = _card(page)
    assert facts["ship"] == "model.int8-dynamic.onnx (onnx-int8-dynamic)"
    assert facts["run it on"] == "onnxruntime-cpu (host I/O)"
    assert facts["p50 at batch 1"].startswith("10.8 ms (95% interval 10.7 ms to 10.9 ms)")
    assert re.fullmatch(r"\d+ of \d+ artifact-runtime pairs passed", facts["validated"])
    assert facts["not run here"] == "1: tensorrt-rtx-fp16" and facts["failed"] == "0"
    assert "ort.InferenceSession(&#34;model.int8-dynamic.onnx&#34;" in page
    # the winner carries no shapes of its own here (as under a served-rate objective): the timed rows name them
    assert (
        "session.run(None, {&#34;input_ids&#34;: input_ids, &#34;attention_mask&#34;: attention_mask})"
        in page
    )


def test_a_provisional_sign_off_is_amber_not_green(inputs):
    inputs["header"] = {**samples.header(), "provisional": True}
    page = render_html(**inputs)
    assert '<div class="card provisional" id="decision">' in page
    assert '<div class="state">PROVISIONAL: signed off, but the winner' in page
    assert ".card.provisional{border-color:#d49b00" in page  # amber, distinct from the green signed_off


def test_a_provisional_card_reads_amber_in_a_headless_browser(inputs, tmp_path):
    """In Chromium, as a reader sees it: the provisional state's words and colours, not the signed-off green."""
    from tests.browser import first_screen

    inputs["header"] = {**samples.header(), "provisional": True}
    page = tmp_path / "signoff.html"
    page.write_text(render_html(**inputs))
    seen = first_screen(page, 900, tmp_path / "provisional.png")
    assert seen["state"].startswith("PROVISIONAL: signed off, but the winner")
    assert seen["border"] == "rgb(212, 155, 0)" and seen["state_colour"] == "rgb(138, 90, 0)"
    assert seen["card"]["bottom"] <= seen["viewport"]["height"] and seen["wrapped"] == []
