"""The report's sections on precision chosen by measurement, in the stages' own measurements: Mixed precision
(the recipe builds onnx-int8-mixed, pipeline/stages/int8_mixed.py): which layers were quantized and why, each
mix it judged and timed, side by side, and every layer's sensitivity, most sensitive first; and the 8-bit layers
of the compiled programs (pipeline/stages/static_mix.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.report.blocks import Block, Para, Section, Table, Text

Dict = Mapping[str, Any]
VARIANT = "onnx-int8-mixed"


def mixed_precision_section(header: Dict) -> Section:
    found = next((a for a in header.get("artifacts") or [] if a.get("name") == VARIANT), None)
    details = (found or {}).get("details") or {}
    mixes, layers = details.get("mixes") or [], details.get("layers") or []
    if not mixes or not layers:
        return Section("Mixed precision", [])
    timed = details.get("timed_at") or {}
    chosen = next((m for m in mixes if m.get("chosen")), None)
    none = next((m for m in mixes if m.get("quantized") == 0), None)
    blocks: list[Block] = [
        Para(
            f"{VARIANT} quantizes {details.get('quantized_count', '?')} of its {len(layers)} weight layers, "
            "chosen by measurement: each layer quantized alone, judged against the recipe's INT8 gate on the "
            "calibration split (its sensitivity is the share of that tolerance it uses); layers added least "
            "sensitive first up to the most that still pass; then that mix, its neighbours, every layer and "
            f"none timed side by side on {timed.get('runtime', '?')} at batch {timed.get('batch', '?')} "
            f"({timed.get('rounds', '?')} interleaved calls each, on calibration samples at their own lengths). "
            f"Kept: {details.get('why', 'the fastest that passes')}."
            + (f" {_choice(chosen, none)}" if chosen else ""),
        ),
        Table(
            [
                "layers quantized",
                "passes the gate",
                "tolerance used",
                "p50 ms",
                "95% interval",
                "speed vs none",
            ],
            [_mix_cells(m, len(layers)) for m in mixes],
            ["winner" if m.get("chosen") else ("bad" if not m.get("passes") else "") for m in mixes],
        ),
        Para("Each layer quantized alone, most sensitive first:", tone="note"),
        Table(
            ["layer", "tolerance used", "quantized"],
            [
                [
                    str(layer.get("node")),
                    _share(layer.get("sensitivity")),
                    "yes" if layer.get("quantized") else "no",
                ]
                for layer in sorted(layers, key=_sensitivity, reverse=True)
            ],
        ),
    ]
    return Section("Mixed precision", blocks)


def _choice(chosen: Dict, none: Dict | None) -> str:
    """One sentence on the kept mix against the float graph timed beside it, as its intervals allow."""
    ratio, mine, theirs = chosen.get("vs_float"), chosen.get("p50_ci95_ms"), (none or {}).get("p50_ci95_ms")
    if not isinstance(ratio, int | float) or not mine or not theirs:
        return ""
    if mine[0] <= theirs[1] and theirs[0] <= mine[1]:
        return (
            f"It is within noise of the float graph timed beside it ({ratio:.2f}x, intervals overlap): on this "
            "host at this batch, quantizing these layers bought no speed."
        )
    if ratio > 1:
        return f"It ran {ratio:.2f}x as fast as the float graph timed beside it, beyond the noise."
    return (
        f"It ran at {ratio:.2f}x the float graph's speed, slower beyond the noise: quantizing did not pay on this "
        "host at this batch (the Speed section compares it with every artifact)."
    )


def _mix_cells(mix: Dict, count: int) -> list[Text]:
    quantized = mix.get("quantized")
    label = "none" if quantized == 0 else ("all" if quantized == count else str(quantized))
    if mix.get("chosen"):
        label += " (kept)"
    ratio = mix.get("vs_float")
    return [
        label,
        "yes" if mix.get("passes") else "no",
        _share(mix.get("tolerance_share")),
        f"{mix['p50_ms']:.3g}" if isinstance(mix.get("p50_ms"), int | float) else "—",
        _interval(mix.get("p50_ci95_ms")),
        f"{ratio:.2f}x" if isinstance(ratio, int | float) else "—",
    ]


def _interval(span: Any) -> str:
    if not isinstance(span, list | tuple) or len(span) != 2:
        return "—"
    return f"{span[0]:.3g}–{span[1]:.3g}"


def _share(value: Any) -> str:
    if value is None:
        return "past it (non-finite output)"
    return f"{100 * value:.1f}%" if isinstance(value, int | float) else "—"


def _sensitivity(layer: Dict) -> float:
    return _number(layer.get("sensitivity"))


def _number(value: Any) -> float:
    return float("inf") if value is None else float(value)


def static_mix_section(header: Dict) -> Section:
    """The 8-bit layers of the compiled programs (exported-/aoti-fp8 and -int8, pipeline/stages/static_mix.py):
    which layers went to 8 bits, and, where every layer at once failed the gate, each layer's sensitivity. The
    AOTInductor package is compiled from the exported program, so one precision's mix is said once."""
    blocks: list[Block] = []
    seen: set[str] = set()
    for artifact in header.get("artifacts") or []:
        details = artifact.get("details") or {}
        precision = str(artifact.get("precision"))
        mix = details.get(f"{precision}_mix")
        if not isinstance(mix, Mapping) or precision in seen:
            continue
        seen.add(precision)
        names = [str(a.get("name")) for a in header.get("artifacts") or [] if a.get("precision") == precision]
        names = [n for n in names if n.startswith(("exported-", "aoti-")) and "packed" not in n]
        blocks.append(Para(f"{' and '.join(names)}: {mix.get('mix', '?')}."))
        sensitivity = mix.get("sensitivity") or {}
        if sensitivity:
            kept = set(mix.get("kept_float") or [])
            ordered = sorted(sensitivity.items(), key=lambda item: -_number(item[1]))  # most sensitive first
            rows: list[list[Text]] = [
                [name, _share(value), "no (kept in FP16)" if name in kept else "yes"]
                for name, value in ordered
            ]
            tones = ["warn" if name in kept else "" for name, _ in ordered]
            blocks += [
                Para(
                    "Each layer's sensitivity is the share of the gate's tolerance it uses quantized alone, on the "
                    "calibration split; layers were added least sensitive first, up to the most that pass "
                    "together. Most sensitive first:",
                    tone="note",
                ),
                Table(["layer", "tolerance used alone", f"in {precision.upper()}"], rows, tones),
            ]
    return Section("8-bit layers of the compiled programs", blocks)
