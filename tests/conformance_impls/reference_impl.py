"""A correct external implementation for `tilenest conformance --impl`: it
speaks the file protocol (spec/conformance/README.md) with plain json/numpy
and runs each program on tilenest's reference interpreter.

    python reference_impl.py CASE INPUTS OUTPUTS
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


#: dtypes that travel as the unsigned integers of their bits, by ml_dtypes type
BITS = {"bf16": "bfloat16", "f8e4m3fn": "float8_e4m3fn", "f8e5m2": "float8_e5m2"}


def read_inputs(folder: Path) -> tuple[list, dict, list]:
    import ml_dtypes

    call = json.loads((folder / "call.json").read_text())
    args, by_name = [], {}
    for e in call["args"]:
        if "alias" in e:
            a = by_name[e["alias"]]
        else:
            a = np.load(folder / e["file"])
            if e["dtype"] in BITS:
                a = a.view(getattr(ml_dtypes, BITS[e["dtype"]]))  # travels as its bits
            if e["kind"] == "scalar":
                a = a[()]
        by_name[e["name"]] = a
        args.append(a)
    return args, call.get("params", {}), call["args"]


def write_outputs(folder: Path, args: list, entries: list) -> None:
    for e, a in zip(entries, args, strict=True):
        if e["kind"] == "tensor":
            bits = np.dtype(f"u{a.dtype.itemsize}")
            np.save(folder / f"{e['name']}.npy", a.view(bits) if e["dtype"] in BITS else a)


def load(case: Path):  # type: ignore[no-untyped-def]
    from tilenest.semantics.verify import verify

    text = case.read_text()
    if case.name.endswith(".json"):
        from tilenest.semantics.jsonio import loads

        prog = loads(text, str(case))
    else:
        import tilenest as tn

        prog = tn.parse(rewrite(text), str(case))
    verify(prog)
    return prog


def rewrite(text: str) -> str:
    """The program text as this implementation understands it (identity here)."""
    return text


def postprocess(args: list, entries: list) -> None:
    """A hook for deliberately wrong implementations (nothing here)."""


def main(argv: list[str]) -> int:
    import tilenest as tn
    from tilenest.conformance import error_kind

    case, inputs, outputs = (Path(a) for a in argv[1:4])
    args, params, entries = read_inputs(inputs)
    try:
        tn.interpret(load(case), *args, params=params or None)
    except tn.errors.TilenestError as e:
        (outputs / "error.json").write_text(json.dumps({"kind": error_kind(e),
                                                        "message": e.message}))
        return 0
    postprocess(args, entries)
    write_outputs(outputs, args, entries)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
