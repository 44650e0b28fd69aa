"""Every conformance kernel's MSL type-checks (clang-19 against the shim).

Each case program is either emitted for ``metal`` and accepted by
``check_msl``, or refused before any MSL exists: with the error its case
expects (the case is about that error), or, for an admitted program that
computes in f64, with Metal's located f64 refusal. Running the cases on the
emulated device is ``tilenest conformance --target metal``
(``test_metal_emulated.py``).
"""

from __future__ import annotations

import pytest

from tilenest import conformance as C
from tilenest.backends import metal
from tilenest.backends.metal.check import check_msl, clang_available
from tilenest.errors import NotAvailableError, TilenestError

pytestmark = pytest.mark.skipif(not clang_available(), reason="clang-19 is not installed")

CASES = C.load_suite(C.default_suite())


def test_every_conformance_kernel_type_checks_or_is_refused_as_expected():
    emitted, refused, f64, fp8 = 0, 0, [], []
    for case in CASES:
        try:
            src = metal.emit(C.load_program(case.program), "msl")
        except NotAvailableError as e:
            if "f8e" in str(e):  # the FP8 formats (V-24): not compiled for Metal
                assert "'metal' target does not compile" in str(e), (case.name, e.render())
                fp8.append(case.name)
                continue
            assert "f64" in str(e) and "Metal" in str(e), (case.name, e.render())
            f64.append(case.name)
            continue
        except TilenestError as e:
            assert case.verdict != "admitted", (case.name, e.render())
            assert C.error_kind(e) == case.verdict, (case.name, case.verdict, e.render())
            refused += 1
            continue
        check_msl(metal.standalone(src), name=f"{case.name}.metal")
        emitted += 1
    assert emitted >= 150 and f64 == ["V13-casts", "V24-fp8-encode"], (emitted, refused, f64)
    assert fp8 == ["V24-fp8-decode-every-code", "V24-fp8-every-boundary"], fp8
