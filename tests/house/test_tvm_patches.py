"""relay_amp.tvm_patches lists every reach of the pass and the builds into TVM beyond its API:
each listed place and pin exists, and no other place makes such a reach."""

import ast
import importlib
import pathlib
import re

import relay_amp
from relay_amp.tvm_patches import PATCHES, describe

PACKAGE = pathlib.Path(relay_amp.__file__).parent
ROOT = PACKAGE.parent
#: What a reach into TVM beyond its API looks like in the source.
REACHES = re.compile(r"register_global_func\(.*override=True|sys\.meta_path\.(insert|append)"
                     r"|__closure__|sys\.modules\[[^\]]+\]\s*=")


def _resolve(where: str):
    module, _, qualname = where.partition(":")
    value = importlib.import_module(module)
    for part in qualname.split("."):
        value = getattr(value, part)
    return value


def test_every_listed_place_and_pin_exists():
    assert len(PATCHES) == 4
    for patch in PATCHES:
        assert callable(_resolve(patch.where)), patch.where
        path, _, test = patch.pin.partition("::")
        source = (ROOT / path).read_text()
        assert not test or re.search(rf"^def {re.escape(test)}\(", source, re.M), patch.pin
    text = describe()
    assert all(p.name in text and p.pin in text for p in PATCHES)


def _enclosing_functions(tree) -> dict:
    """Line number -> qualified name of the innermost function or class around it."""
    found = {}

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}.{child.name}" if prefix else child.name
                for line in range(child.lineno, (child.end_lineno or child.lineno) + 1):
                    found[line] = name
                visit(child, name)
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def _reaches() -> set:
    """``module:qualified name`` of every function of the pass and the builds whose source
    matches :data:`REACHES` (the harness and the command are not the pass)."""
    places = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).parts
        if {"eval", "cli"} & set(parts) or path.name == "tvm_patches.py":
            continue
        source = path.read_text()
        functions = _enclosing_functions(ast.parse(source))
        module = ".".join(("relay_amp", *path.relative_to(PACKAGE).with_suffix("").parts))
        for number, line in enumerate(source.splitlines(), 1):
            if REACHES.search(line):
                places.add(f"{module}:{functions.get(number, '<module>')}")
    return places


def test_no_reach_into_tvm_is_left_off_the_list():
    listed = {p.where for p in PATCHES}
    assert _reaches() == listed


def test_the_scan_sees_a_reach():
    probe = PACKAGE / "_patch_probe.py"
    probe.write_text("import sys\n\ndef sneaky():\n    sys.meta_path.insert(0, object())\n")
    try:
        assert "relay_amp._patch_probe:sneaky" in _reaches()
    finally:
        probe.unlink()
