"""Whether two float32 builds of one model differ by no more than float32 rounding of
reordered sums (issue 44 item 2), on a whole model.

A dot product of ``K`` terms summed in another order (a register tile, a split reduction)
moves by at most ``K * 2**-23 * sum|a * b|``. Through a model each kernel's difference is
carried into the next; :func:`reordering_bound` states the model's bound as the sum of that
per-kernel factor over every reduction the model executes, relative to the output's largest
magnitude::

    max |ours - plain| <= 2**-23 * sum(K over the model's reductions) * max |plain|

It is loose (a network's rounding differences do not add up in the worst case), so the
comparison also reports the measured difference beside it; a build that reads a wrong weight
or a wrong row differs by the outputs' own magnitude and fails it.

A model that ranks rows (a detector's top-k after non-maximum suppression) orders two rows
whose scores tie to within rounding either way: the two builds then list the same rows, two
of them swapped. :func:`compare` accepts that, and says so (``rows_moved``), only where every
output has the same rows, each moved row matches a row of the other build within the bound in
every output, and it moved among rows that tie, within the bound, in some output (the score
they were ranked by).
"""

from __future__ import annotations

import numpy as np

#: float32's machine epsilon (twice its unit roundoff): one addition's relative rounding, bounded.
EPSILON = 2.0 ** -23
#: ``IterVar.iter_type`` of a reduction axis (TVM's ``kCommReduce``).
_REDUCE = 2


def _reduction_length(func) -> int:
    """The terms summed per output, added over ``func``'s reduction blocks (a symbolic extent
    counts as 1: the bound then misses that block's part)."""
    import tvm

    from ..relax_utils import prim_func_blocks

    total = 0
    for block in prim_func_blocks(func):
        reduced = [var.dom.extent for var in block.iter_vars if int(var.iter_type) == _REDUCE]
        if reduced:
            total += int(np.prod([int(e) if isinstance(e, tvm.tirx.IntImm) else 1
                                  for e in reduced]))
    return total


def reduction_terms(mod) -> int:
    """``sum(K)``: every reduction's terms per output, over every kernel call of ``mod``'s
    ``main`` (a Relax module as imported; it is legalized here, not changed)."""
    import tvm
    from tvm import relax

    legal = relax.transform.LegalizeOps()(mod)
    lengths = {gvar: _reduction_length(func) for gvar, func in legal.functions.items()
               if isinstance(func, tvm.tirx.PrimFunc)}
    total = 0

    def visit(expr):
        nonlocal total
        if isinstance(expr, relax.Call) and expr.args and isinstance(expr.args[0],
                                                                     tvm.ir.GlobalVar):
            total += lengths.get(expr.args[0], 0)

    for func in legal.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return total


def reordering_bound(terms: int, plain: np.ndarray) -> float:
    """The largest difference :mod:`this module's <relay_amp.eval.rounding>` bound allows
    from ``plain``, one output, for a model of ``terms`` summed terms (:func:`reduction_terms`)."""
    finite = np.abs(plain[np.isfinite(plain)])
    return EPSILON * terms * (float(finite.max()) if finite.size else 0.0)


def compare(ours, plain, terms: int) -> list[dict]:
    """Per output: the largest difference of ``ours`` from ``plain``, the bound, the
    difference relative to the output's largest magnitude, and whether it holds (an
    integer output must be equal; a NaN or infinity must be where the other build has one).
    Where ranked rows that tie swapped places (the module's docstring), every output holds
    and ``rows_moved`` says how many rows moved; ``max_abs`` stays the difference in place.

    Raises
    ------
    ValueError
        If the two builds give different numbers of outputs or shapes.
    """
    if len(ours) != len(plain):
        raise ValueError(f"{len(ours)} outputs against {len(plain)}")
    rows = []
    for index, (a, b) in enumerate(zip(ours, plain)):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            raise ValueError(f"output {index}: shape {a.shape} against {b.shape}")
        if b.dtype.kind != "f":
            equal = bool(np.array_equal(a, b))
            rows.append({"output": index, "max_abs": 0.0 if equal else float("inf"),
                         "bound": 0.0, "relative": 0.0 if equal else float("inf"),
                         "within": equal})
            continue
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        finite = np.isfinite(b64)
        same_specials = bool(np.array_equal(finite, np.isfinite(a64))
                             and np.array_equal(a64[~finite], b64[~finite], equal_nan=True))
        diff = float(np.abs(a64[finite] - b64[finite]).max()) if same_specials and finite.any() \
            else 0.0 if same_specials else float("inf")
        bound = reordering_bound(terms, b64)
        scale = float(np.abs(b64[finite]).max()) if finite.any() else 0.0
        rows.append({"output": index, "max_abs": diff, "bound": bound,
                     "relative": diff / scale if scale else 0.0, "within": diff <= bound})
    if not all(row["within"] for row in rows):
        moved = _ranked_rows_moved(ours, plain, [row["bound"] for row in rows])
        if moved:
            for row in rows:
                row.update(within=True, rows_moved=moved)
    return rows


def _ranked_rows_moved(ours, plain, bounds) -> int:
    """How many rows (axis 1 of a batch of one, every output having as many) ``ours`` lists in
    another place than ``plain``, where each matches a row of ``plain`` within ``bounds`` in
    every output and moved only to the place of a row it ties with, within the bound, in some
    float output; 0 where no such matching exists."""
    pairs = [(np.asarray(a, np.float64), np.asarray(b)) for a, b in zip(ours, plain)]
    if not pairs or any(b.ndim < 2 or b.shape[0] != 1 or b.shape[1] != pairs[0][1].shape[1]
                        for _, b in pairs):
        return 0
    floats = [b.dtype.kind == "f" for _, b in pairs]
    ours_rows = [a[0].reshape(a.shape[1], -1) for a, _ in pairs]
    plain_rows = [b[0].reshape(b.shape[1], -1).astype(np.float64) for _, b in pairs]

    def within(x, y, bound):
        return bool(np.array_equal(np.isnan(x), np.isnan(y))
                    and np.all(np.abs(np.nan_to_num(x) - np.nan_to_num(y)) <= bound))

    def close(i, j):  # ours' row j is plain's row i
        return all(within(o[j], p[i], bound)
                   for o, p, bound in zip(ours_rows, plain_rows, bounds))

    def tie(i, j):  # plain's rows i and j rank alike: equal within the bound in a float output
        return any(f and within(p[i], p[j], bound)
                   for f, p, bound in zip(floats, plain_rows, bounds))

    count = plain_rows[0].shape[0]
    unused, moved = set(range(count)), 0
    for i in range(count):
        j = i if i in unused and close(i, i) else next(
            (j for j in sorted(unused) if tie(i, j) and close(i, j)), None)
        if j is None:
            return 0
        unused.discard(j)
        moved += j != i
    return moved
