"""Region ops: the four nest kinds, dynamic control flow and ``yield``.

Every nest op binds coordinate variables ``vars`` ranging over its ``domain``
(an IndexSet) and owns one body Block. Values defined outside and *updated*
inside a region are threaded explicitly: the op's operands are the incoming
values, the body's block arguments (after nothing else) are their per-iteration
(or per-child) incoming versions, the body's ``yield`` gives the outgoing ones,
and the op's results are the values after the region.

* ``parallel``  -- children in no order; results join per-child updates;
* ``serial``    -- iterations in total (lexicographic, or reversed) order;
* ``pipeline``  -- serial reference meaning; body is a sequence of ``stage`` ops;
* ``reduce``    -- operands are seeds; the policy and contracts say which
  evaluation orders are admitted;
* ``stage``     -- one ordered segment of a pipeline iteration; its results are
  the values later stages use;
* ``if``        -- two regions (then, else) yielding the results;
* ``while``     -- a ``cond`` region yielding a bool scalar and a ``body``
  region yielding the next carried values.
"""

from __future__ import annotations

from typing import Any

from ...errors import TypeCheckError
from .. import dtypes as D
from ..types import TileType
from . import define, type_rule

_NEST_ATTRS = (("vars", "vars"), ("domain", "indexset"))
define("parallel", "regions", attrs=_NEST_ATTRS + (("level", "int"),),
       optional=(("exec", "exec"),), traits=("region",), regions=1)
define("serial", "regions", attrs=_NEST_ATTRS + (("order", "str"),), traits=("region",),
       regions=1)
define("pipeline", "regions", attrs=_NEST_ATTRS + (("policy", "pipeline"),),
       traits=("region",), regions=1)
define("reduce", "regions",
       attrs=_NEST_ATTRS + (("policy", "rpolicy"), ("contracts", "contracts")),
       traits=("region",), regions=1)
define("stage", "regions", attrs=(("name", "str"), ("ordinal", "int")), traits=("region",),
       regions=1, operands=(0, 0))
define("if", "regions", traits=("region",), regions=2, operands=(1, 1))
define("while", "regions", traits=("region",), regions=2)
define("yield", "regions", traits=("terminator",))


@type_rule("parallel", "serial", "pipeline", "reduce", "while")
def _carry(ts: tuple, attrs: Any, hint: tuple) -> tuple:
    return tuple(ts)


@type_rule("stage")
def _stage(ts: tuple, attrs: Any, hint: tuple) -> tuple:
    return tuple(hint)


@type_rule("if")
def _if(ts: tuple, attrs: Any, hint: tuple) -> tuple:
    c = ts[0]
    if not isinstance(c, TileType) or not c.is_scalar or c.dtype != D.bool_:
        raise TypeCheckError("if condition must be a bool scalar")
    return tuple(hint)


@type_rule("yield")
def _yield(ts: tuple, attrs: Any, hint: tuple) -> tuple:
    return ()
