"""tests/claims.py reads a sign-off against its own numbers; a checker that misranks checks reports true
sentences as false (a hold-out classifier's exact-match failure was ranked below a passing score bound)."""

from __future__ import annotations

from tests.claims import worst_checks


def _check(output: str, value: float, threshold: float) -> dict:
    return {
        "output": output,
        "metric": "max_abs",
        "value": value,
        "threshold": threshold,
        "informational": False,
    }


def test_a_broken_exact_bound_is_the_worst_check() -> None:
    checks = [_check("conf", 0.0012, 0.0013), _check("pred", 1, 0), _check("logits", 0.01, 1.0)]
    assert worst_checks(checks)["max_abs"]["output"] == "pred"


def test_a_met_exact_bound_is_not() -> None:
    checks = [_check("pred", 0, 0), _check("conf", 0.0012, 0.0013)]
    assert worst_checks(checks)["max_abs"]["output"] == "conf"
