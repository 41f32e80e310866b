"""Named repairs of exported ONNX graphs that TVM's ONNX importer cannot take as they are.

MXNet's ONNX exporter writes a few constructs that are valid (or nearly valid) ONNX but stop
``tvm.relax.frontend.onnx.from_onnx`` or the compile after it. Each repair below rewrites one
such construct into an equivalent one, edits the model in place, and returns how many places it
changed (0 when the model has none), so a loader can record what was done:

- :func:`keep_one_resize_target`: ``Resize`` given both ``scales`` and ``sizes``;
- :func:`decompose_lp_normalization`: ``LpNormalization``, which the importer lacks;
- :func:`set_split_num_outputs`: opset-18+ ``Split`` with neither ``split`` nor ``num_outputs``,
  which onnxruntime (and so onnxsim) rejects;
- :func:`fold_runtime_pads`: ``Pad`` whose pads are computed from shapes at run time, folded
  to constants at a fixed input shape;
- :func:`static_nms_gather`: the box table after ``NonMaxSuppression`` (MXNet's ``box_nms``),
  gathered with static shapes.

:func:`repair` applies all of them in that order.
"""

from __future__ import annotations

import numpy as np

#: Ops whose output shape depends on input values: shapes computed after them cannot be folded
#: at a fixed input shape.
DATA_DEPENDENT_SHAPE_OPS = frozenset({"NonMaxSuppression", "NonZero", "Unique", "Compress",
                                      "Loop", "If", "Scan"})


# ------------------------------------------------------------------------------ graph helpers
def _opset(model) -> int:
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    raise ValueError("the model imports no default-domain (ai.onnx) opset")


def _constant_values(model) -> dict:
    """Every tensor whose value is known without running the graph: initializers and the
    outputs of ``Constant`` nodes, as numpy arrays."""
    from onnx import numpy_helper

    values = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attribute in node.attribute:
                if attribute.name == "value":
                    values[node.output[0]] = numpy_helper.to_array(attribute.t)
    return values


def _producers(model) -> dict:
    return {output: node for node in model.graph.node for output in node.output if output}


def _consumers(model, name: str) -> list:
    return [node for node in model.graph.node if name in node.input]


def _unique_name(model, base: str) -> str:
    taken = {o for n in model.graph.node for o in n.output} | {
        i.name for i in model.graph.initializer} | {i.name for i in model.graph.input}
    name, index = base, 0
    while name in taken:
        index += 1
        name = f"{base}_{index}"
    return name


def _add_initializer(model, base: str, value: np.ndarray) -> str:
    from onnx import numpy_helper

    name = _unique_name(model, base)
    model.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
    return name


def _ancestors(model, names) -> set:
    """The nodes (by id) that the tensors ``names`` are computed from."""
    producers = _producers(model)
    seen, stack = {}, list(names)
    while stack:
        node = producers.get(stack.pop())
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        stack.extend(node.input)
    return seen


def remove_unused_nodes(model) -> int:
    """Drop nodes none of whose outputs reaches a graph output, and the initializers nothing
    reads any more (from the graph inputs too, where exporters also list them). Returns how
    many nodes were dropped."""
    graph = model.graph
    needed = _ancestors(model, [o.name for o in graph.output])
    keep = [node for node in graph.node if id(node) in needed]
    removed = len(graph.node) - len(keep)
    if removed:
        del graph.node[:]
        graph.node.extend(keep)
    read = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    unread = {i.name for i in graph.initializer if i.name not in read}
    if unread:
        initializers = [i for i in graph.initializer if i.name not in unread]
        inputs = [i for i in graph.input if i.name not in unread]
        del graph.initializer[:]
        graph.initializer.extend(initializers)
        del graph.input[:]
        graph.input.extend(inputs)
    return removed


# ------------------------------------------------------------------------------ the repairs
def keep_one_resize_target(model) -> int:
    """``Resize`` given both ``scales`` and ``sizes`` keeps only ``sizes``.

    The ONNX spec allows one of the two; MXNet's exporter writes an empty ``scales`` tensor next
    to ``sizes`` (older runtimes read an empty tensor as absent), and TVM's importer asserts
    "Only one of scales and sizes can be provided". ``sizes`` is the one kept because it states
    the output shape exactly, while ``scales`` would be rounded to it; only an empty constant
    ``sizes`` gives way to ``scales``.
    """
    constants = _constant_values(model)
    changed = 0
    for node in model.graph.node:
        if node.op_type != "Resize" or len(node.input) < 4:
            continue
        scales, sizes = node.input[2], node.input[3]
        if not scales or not sizes:
            continue
        if sizes in constants and constants[sizes].size == 0:
            node.input[3] = ""  # an empty sizes next to real scales: the scales stand
            del node.input[3:]
        else:
            node.input[2] = ""
        changed += 1
    return changed


def decompose_lp_normalization(model) -> int:
    """``LpNormalization(x, axis, p)`` becomes ``x / ReduceSum(|x|^p, axis) ^ (1/p)`` in plain ops
    (p = 2: ``x / Sqrt(ReduceSum(x * x))``; p = 1: ``x / ReduceSum(Abs(x))``).

    TVM's importer has no ``LpNormalization``. Written out, the sum of squares is an ordinary
    reduction, which a mixed-precision pass can keep in float32.
    """
    from onnx import helper

    opset = _opset(model)
    nodes = []
    changed = 0
    for node in model.graph.node:
        if node.op_type != "LpNormalization":
            nodes.append(node)
            continue
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        axis, power = int(attributes.get("axis", -1)), int(attributes.get("p", 2))
        if power not in (1, 2):
            raise ValueError(f"LpNormalization {node.name!r}: p must be 1 or 2 (the ONNX "
                             f"spec's values); got {power}")
        x, out = node.input[0], node.output[0]
        prefix = _unique_name(model, (node.name or out) + "_lpnorm")
        magnitude = f"{prefix}_abs" if power == 1 else f"{prefix}_square"
        if power == 1:
            nodes.append(helper.make_node("Abs", [x], [magnitude], name=magnitude))
        else:
            nodes.append(helper.make_node("Mul", [x, x], [magnitude], name=magnitude))
        total = f"{prefix}_sum"
        if opset >= 13:
            axes = _add_initializer(model, f"{prefix}_axes", np.array([axis], np.int64))
            nodes.append(helper.make_node("ReduceSum", [magnitude, axes], [total], keepdims=1,
                                          name=total))
        else:
            nodes.append(helper.make_node("ReduceSum", [magnitude], [total], axes=[axis],
                                          keepdims=1, name=total))
        norm = total
        if power == 2:
            norm = f"{prefix}_norm"
            nodes.append(helper.make_node("Sqrt", [total], [norm], name=norm))
        nodes.append(helper.make_node("Div", [x, norm], [out], name=node.name or out))
        changed += 1
    if changed:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return changed


def set_split_num_outputs(model) -> int:
    """Opset-18+ ``Split`` without a ``split`` input gets ``num_outputs`` = its output count.

    From opset 18 the attribute is required when ``split`` is absent; MXNet's exporter omits
    it, and onnxruntime (so onnxsim, and :func:`fold_runtime_pads`) refuses the model.
    """
    from onnx import helper

    if _opset(model) < 18:
        return 0
    changed = 0
    for node in model.graph.node:
        if node.op_type != "Split" or (len(node.input) > 1 and node.input[1]):
            continue
        if any(a.name == "num_outputs" for a in node.attribute):
            continue
        node.attribute.append(helper.make_attribute("num_outputs", len(node.output)))
        changed += 1
    return changed


def _evaluate(model, names: list, input_shapes: dict) -> list:
    """Values of the tensors ``names`` with onnxruntime, on zeros of ``input_shapes``: only
    the part of the graph they are computed from runs."""
    import onnx
    import onnxruntime
    from onnx import helper

    needed = _ancestors(model, names)
    graph = model.graph
    initializers = {i.name for i in graph.initializer}
    inputs = [i for i in graph.input if i.name not in initializers]
    used = {name for node in needed.values() for name in node.input}
    feeds = [i for i in inputs if i.name in used]
    missing = [i.name for i in feeds if i.name not in input_shapes]
    if missing:
        raise ValueError(f"input shapes needed for {', '.join(missing)}")
    outputs = [helper.make_empty_tensor_value_info(name) for name in names]
    sub_graph = helper.make_graph([n for n in graph.node if id(n) in needed], "fold",
                                  feeds, outputs,
                                  [i for i in graph.initializer if i.name in used])
    sub = helper.make_model(sub_graph, opset_imports=list(model.opset_import))
    sub.ir_version = min(model.ir_version, onnx.IR_VERSION)
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # exporters list weights as inputs; ORT warns per weight
    session = onnxruntime.InferenceSession(sub.SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
    dtypes = {1: np.float32, 6: np.int32, 7: np.int64, 9: np.bool_, 10: np.float16,
              11: np.float64}
    feed = {i.name: np.zeros(input_shapes[i.name], dtypes[i.type.tensor_type.elem_type])
            for i in feeds}
    return session.run(names, feed)


def shape_derived(model, name: str) -> bool:
    """Whether tensor ``name`` depends on the graph inputs only through their shapes (via
    ``Shape`` nodes), with no op of :data:`DATA_DEPENDENT_SHAPE_OPS` anywhere upstream: then a
    fixed input shape fixes its value."""
    producers = _producers(model)
    initializers = {i.name for i in model.graph.initializer}
    inputs = {i.name for i in model.graph.input} - initializers
    stack, seen = [name], set()
    while stack:
        tensor = stack.pop()
        if tensor in seen or not tensor:
            continue
        seen.add(tensor)
        node = producers.get(tensor)
        if node is None:
            if tensor in inputs:
                return False
            continue
        if node.op_type in DATA_DEPENDENT_SHAPE_OPS:
            return False
        if node.op_type == "Shape":
            upstream = _ancestors(model, [node.input[0]]).values()
            if any(n.op_type in DATA_DEPENDENT_SHAPE_OPS for n in upstream):
                return False
            continue
        stack.extend(node.input)
    return True


def fold_runtime_pads(model, input_shapes: dict) -> int:
    """``Pad`` whose ``pads`` (or ``constant_value``) are computed at run time from shapes gets
    them as constants, evaluated at ``input_shapes`` ({input name: shape}); a ``Pad`` whose
    data is a shape as well (MXNet pads shape vectors to a fixed rank) becomes a constant.

    TVM's importer takes constant pads only, and no shape as a Pad's data ("cannot handle
    ShapeExpr inputs"), also after onnxsim. The folded module is only valid at that input
    shape, which is the one the sweep compiles for. A Pad whose pads depend on values (see
    :func:`shape_derived`) is left as it is.
    """
    constants = _constant_values(model)
    targets = []
    for node in model.graph.node:
        if node.op_type != "Pad" or len(node.input) < 2:
            continue
        dynamic = [name for name in node.input[1:3] if name and name not in constants]
        if not all(shape_derived(model, name) for name in dynamic):
            continue
        whole = node.input[0] not in constants and shape_derived(model, node.input[0])
        if dynamic or whole:
            targets.append((node, [node.output[0]] if whole else dynamic))
    if not targets:
        return 0
    names = sorted({name for _, folded in targets for name in folded})
    values = dict(zip(names, _evaluate(model, names, input_shapes)))
    for node, folded in targets:
        if folded == [node.output[0]]:
            model.graph.node.remove(node)
            _add_initializer(model, node.output[0], values[node.output[0]])
            continue
        for position in (1, 2):
            if position < len(node.input) and node.input[position] in folded:
                node.input[position] = _add_initializer(
                    model, node.input[position] + "_folded", values[node.input[position]])
    remove_unused_nodes(model)
    return len(targets)


def _is_batch_box_slice(node, constants) -> bool:
    """Whether ``node`` is ``Slice(x, starts=[0], ends=[3], axes=[-1 or 1], steps=[2])``: the
    batch and box columns of NMS output."""
    if node.op_type != "Slice" or len(node.input) < 5:
        return False
    values = [constants.get(name) for name in node.input[1:5]]
    if any(v is None for v in values):
        return False
    starts, ends, axes, steps = (np.asarray(v).reshape(-1).tolist() for v in values)
    return starts == [0] and ends[0] >= 3 and axes[0] in (-1, 1) and steps == [2]


def static_nms_gather(model) -> int:
    """The box table after ``NonMaxSuppression`` is built with static shapes.

    MXNet's ``box_nms`` exports as: NMS selects K of the N boxes; ``GatherND`` takes their rows
    (a ``(K, 6)`` table) and ``Pad`` adds a row of -1; ``ScatterND`` writes each selected box's
    rank into a ``(B, N)`` table filled with K, where K is read from ``Shape(nms)``; ascending
    ``TopK`` sorts it, and ``Gather`` reads the padded table at the sorted ranks, giving
    ``(B, N, 6)``: the selected rows in NMS order, then rows of -1. TVM types the NMS output
    with its largest shape at import, so every shape read from it (K, the ranks ``Range``, the
    padded table) is baked in as that bound, and after legalization the real ``(K, 3)`` output
    meets them: the compile fails ("Argument 0 type mismatch: expected R.Tensor((N, 6))").

    The rewrite builds the same table without reading a shape from the NMS output, and with no
    sort or scan over it (TVM dispatches those before legalization, at the bound shape): a
    ``ScatterND`` of ones at the selected (batch, box) pairs marks the selected boxes (its
    ``(K,)`` updates come from elementwise ops on a ``Gather`` column of the NMS output); a
    descending ``TopK`` of their scores (-inf where not selected) orders them; the rows are read
    from the ``(B, N, 6)`` input with ``GatherElements``, and ``Where`` writes the fill value
    (-1) after the selected ones. NMS returns one class's boxes in descending score, so for
    MXNet's single score row and a batch of one the table is the original one (boxes of equal
    score may swap places).
    """
    from onnx import TensorProto, helper

    producers = _producers(model)
    constants = _constant_values(model)
    changed = 0
    for gather in [n for n in model.graph.node if n.op_type == "Gather"]:
        pad, topk = producers.get(gather.input[0]), producers.get(gather.input[1])
        if pad is None or topk is None or pad.op_type != "Pad" or topk.op_type != "TopK":
            continue
        gathered = producers.get(pad.input[0])
        scatter = producers.get(topk.input[0])
        if gathered is None or gathered.op_type != "GatherND" or scatter is None or (
                scatter.op_type != "ScatterND") or topk.output[0] != gather.input[1]:
            continue
        columns = producers.get(gathered.input[1])
        if scatter.input[1] != gathered.input[1] or columns is None or (
                not _is_batch_box_slice(columns, constants)):
            continue
        nms = producers.get(columns.input[0])
        if nms is None or nms.op_type != "NonMaxSuppression":
            continue
        fill = constants.get(pad.input[2]) if len(pad.input) > 2 and pad.input[2] else None
        fill = np.float32(0.0 if fill is None else np.asarray(fill).reshape(-1)[0])
        table, selected = gathered.input[0], nms.output[0]
        prefix = _unique_name(model, (gather.name or gather.output[0]) + "_static")

        def const(suffix, value, dtype=np.int64, prefix=prefix):
            return _add_initializer(model, f"{prefix}_{suffix}_value", np.array(value, dtype))

        def name(suffix, prefix=prefix):
            return f"{prefix}_{suffix}"

        scores = nms.input[1]
        new = [
            helper.make_node("Gather", [selected, const("batch_box", [0, 2])],
                             [name("batch_box")], axis=1),
            # a scalar index drops the axis: a (K,) column with no Squeeze, whose output shape
            # TVM's importer would fix at the import-time bound
            helper.make_node("Gather", [selected, const("first", 0)], [name("column")], axis=1),
            helper.make_node("Cast", [name("column")], [name("column_float")],
                             to=TensorProto.FLOAT),
            helper.make_node("Mul", [name("column_float"), const("zero", 0.0, np.float32)],
                             [name("zeros")]),
            helper.make_node("Add", [name("zeros"), const("one", 1.0, np.float32)],
                             [name("ones")]),
            helper.make_node("Gather", [scores, const("class_row", 0)], [name("box_scores")],
                             axis=1),
            helper.make_node("Mul", [name("box_scores"), const("none", 0.0, np.float32)],
                             [name("unselected")]),
            helper.make_node("ScatterND", [name("unselected"), name("batch_box"), name("ones")],
                             [name("selected_mask")]),
            helper.make_node("Greater", [name("selected_mask"), const("half", 0.5, np.float32)],
                             [name("is_selected")]),
            helper.make_node("Where", [name("is_selected"), name("box_scores"),
                                       const("minus_inf", -np.inf, np.float32)],
                             [name("sort_key")]),
            helper.make_node("Shape", [table], [name("table_shape")]),
            helper.make_node("Slice", [name("table_shape"), const("n1", [1]), const("n2", [2])],
                             [name("box_count")]),
            helper.make_node("TopK", [name("sort_key"), name("box_count")],
                             [name("sorted_keys"), name("order")], axis=-1, largest=1,
                             sorted=1),
            helper.make_node("GatherElements", [name("selected_mask"), name("order")],
                             [name("sorted_mask")], axis=1),
            helper.make_node("Greater", [name("sorted_mask"),
                                         const("half_again", 0.5, np.float32)], [name("valid")]),
            helper.make_node("Unsqueeze", [name("valid"), const("last", [-1])],
                             [name("valid_rows")]),
            helper.make_node("Unsqueeze", [name("order"), const("last_again", [-1])],
                             [name("order_rows")]),
            helper.make_node("Expand", [name("order_rows"), name("table_shape")],
                             [name("order_table")]),
            helper.make_node("GatherElements", [table, name("order_table")], [name("rows")],
                             axis=1),
            helper.make_node("Where", [name("valid_rows"), name("rows"),
                                       const("fill", fill, np.float32)], [gather.output[0]]),
        ]
        for node in new:
            node.name = node.output[0]
        position = list(model.graph.node).index(gather)
        model.graph.node.remove(gather)
        for offset, node in enumerate(new):
            model.graph.node.insert(position + offset, node)
        changed += 1
    if changed:
        remove_unused_nodes(model)
    return changed


def repair(model, input_shapes: dict) -> list[str]:
    """Apply every repair in place; returns one note per repair that changed something.

    ``input_shapes`` ({input name: shape}) is the fixed shape run-time pads are folded at.
    """
    notes = []
    for name, count in (
            ("Resize with scales and sizes: kept sizes", keep_one_resize_target(model)),
            ("LpNormalization decomposed", decompose_lp_normalization(model)),
            ("Split given num_outputs", set_split_num_outputs(model)),
            ("Pad with run-time pads folded at the input shape",
             fold_runtime_pads(model, input_shapes)),
            ("NMS box table gathered with static shapes", static_nms_gather(model))):
        if count:
            notes.append(f"ONNX repair: {name} ({count} node{'s' if count > 1 else ''})")
    return notes


__all__ = ["keep_one_resize_target", "decompose_lp_normalization", "set_split_num_outputs",
           "fold_runtime_pads", "static_nms_gather", "remove_unused_nodes", "shape_derived",
           "repair",
           "DATA_DEPENDENT_SHAPE_OPS"]
