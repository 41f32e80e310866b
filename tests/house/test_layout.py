"""The house rules that keep the pass apart from the user's command and the harness."""

import ast
import pathlib
import subprocess
import sys

import tvm

import relay_amp

PACKAGE = pathlib.Path(relay_amp.__file__).parent
PASS_MODULES = sorted(p for p in PACKAGE.rglob("*.py")
                      if not {"eval", "cli"} & set(p.relative_to(PACKAGE).parts))


def _imported_modules(path: pathlib.Path) -> set:
    """Absolute names of the modules a file imports (relative imports resolved in the
    package; a file outside it, a test, has none)."""
    inside = path.is_relative_to(PACKAGE)
    package = ".".join(("relay_amp",) + path.relative_to(PACKAGE).parent.parts) if inside else ""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def test_pass_modules_never_import_the_harness_or_the_command():
    assert len(PASS_MODULES) >= 10
    offenders = {str(p.relative_to(PACKAGE)): sorted(
        n for n in _imported_modules(p) if n.startswith(("relay_amp.eval", "relay_amp.cli")))
                 for p in PASS_MODULES}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_import_relay_amp_loads_no_harness_module_and_no_harness_dependency():
    # Whatever `import tvm` loads itself (it imports torch when torch is installed, and torch
    # imports tqdm) is TVM's dependency, not ours: count only what relay_amp adds on top.
    code = ("import sys, tvm\n"
            "before = set(sys.modules)\n"
            "import relay_amp\n"
            "print(sorted(m for m in set(sys.modules) - before if m.startswith('relay_amp.eval')"
            " or m.split('.')[0] in ('tqdm', 'onnx', 'hypothesis', 'mxnet', 'matplotlib',"
            " 'torch', 'transformers')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]"


def test_the_import_check_sees_a_harness_import(tmp_path):
    bad = PACKAGE / "_layout_probe.py"
    bad.write_text("from .eval import sweep\n")
    try:
        assert "relay_amp.eval.sweep" in _imported_modules(bad)
    finally:
        bad.unlink()


def test_tvm_private_builder_calls_are_used_in_one_wrapper_and_still_exist():
    from tvm import relax

    from relay_amp.relax_utils import BuiltBlock

    users = sorted(str(p.relative_to(PACKAGE)) for p in PASS_MODULES
                   if any(name in p.read_text() for name in BuiltBlock.PRIVATE_CALLS))
    assert users == ["relax_utils.py"]
    assert sum(p.read_text().count("._begin_") for p in PASS_MODULES) == 2  # in BuiltBlock only
    for name in BuiltBlock.PRIVATE_CALLS:
        assert callable(getattr(relax.BlockBuilder, name, None)), name
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2,), "float32"))
    with builder.function("f", [x]):
        with BuiltBlock(builder, dataflow=True) as built:
            builder.emit(relax.op.add(x, x))
        assert isinstance(built.block, relax.DataflowBlock) and len(built.block.bindings) == 1
        builder.emit_func_output(x)


def test_readme_layout_names_every_module():
    """Each module of the package appears in docs/DESIGN.md's Layout section (by path, or by
    file name in a line that lists several of one folder)."""
    design = (PACKAGE.parent / "docs" / "DESIGN.md").read_text()
    layout = design.split("## Layout", 1)[1].split("\n## ", 1)[0]
    missing = [str(p.relative_to(PACKAGE.parent)) for p in PACKAGE.rglob("*.py")
               if p.name != "__init__.py" and f"`{p.relative_to(PACKAGE.parent)}`" not in layout
               and f"`{p.name}`" not in layout]
    assert not missing, f"docs/DESIGN.md's Layout section does not name {missing}"



TESTS = pathlib.Path(__file__).resolve().parents[1]
#: What both test layers import: modules beside conftest.py, not test files.
SHARED_TEST_MODULES = [TESTS / name for name in
                       ("cases.py", "helpers.py", "stages.py", "cuda_checks.py")]


def test_the_pass_tests_import_no_harness_and_no_command():
    files = sorted((TESTS / "pass").glob("*.py"))
    assert len(files) >= 20
    offenders = {p.name: sorted(n for n in _imported_modules(p)
                                if n.startswith(("relay_amp.eval", "relay_amp.cli")))
                 for p in [*files, *SHARED_TEST_MODULES]}
    assert {k: v for k, v in offenders.items() if v} == {}


def _test_file_imports(path: pathlib.Path) -> set:
    """The test files (``test_*`` modules, anywhere under tests/) that ``path`` imports, in its
    code or in the code it runs in a child process."""
    text = path.read_text()
    found = {n.split(".")[0] for n in _imported_modules(path) if n.startswith("test_")}
    for line in text.splitlines():
        words = line.strip().split()
        if len(words) >= 2 and words[0] in ("from", "import") and words[1].startswith("test_"):
            found.add(words[1].split(".")[0])
    return found


def test_no_test_file_imports_a_test_file_of_another_layer():
    """What both layers use lives in the shared modules beside conftest.py (tests/cases.py,
    helpers.py, stages.py, cuda_checks.py), not in another layer's test file."""
    where = {p.stem: p.parent.name for p in TESTS.rglob("test_*.py")}
    crossing = {f"{p.parent.name}/{p.name}": sorted(f"{where.get(n, '?')}/{n}" for n in
                                                  _test_file_imports(p)
                                                  if where.get(n) != p.parent.name)
                for p in TESTS.rglob("test_*.py")}
    assert {k: v for k, v in crossing.items() if v} == {}
    shared = {p.name for p in SHARED_TEST_MODULES}
    assert {n.split(".")[0] + ".py" for p in SHARED_TEST_MODULES
            for n in _imported_modules(p)} & {p.name for p in TESTS.rglob("test_*.py")} == set()
    assert "cases.py" in shared


def test_the_goldens_and_the_pass_tests_convert_the_same_shared_cases():
    import cases

    golden = _imported_modules(TESTS / "eval" / "test_golden.py")
    assert "cases" in golden
    readers = [p for p in (TESTS / "pass").glob("test_*.py") if "cases" in _imported_modules(p)]
    assert len(readers) >= 8
    assert len(cases.GOLDEN) >= 10 and all(
        isinstance(mod, tvm.IRModule) for mod in cases.GOLDEN.values())


def test_tests_live_in_the_folder_of_what_they_test():
    assert sorted(p.name for p in TESTS.glob("test_*.py")) == []
    assert {p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))
            } >= {"pass", "cli", "eval", "house"}


def test_the_command_never_imports_the_harness_it_hands_sweep_and_bench_to():
    """No import loop between the command and the harness: relay_amp.cli finds the harness's
    subcommands as entry points; only the harness imports the command's helpers."""
    from relay_amp import cli

    command = sorted((PACKAGE / "cli").glob("*.py"))
    offenders = {p.name: sorted(n for n in _imported_modules(p) if n.startswith("relay_amp.eval"))
                 for p in command}
    assert {k: v for k, v in offenders.items() if v} == {}
    plugins = cli.plugin_commands()
    assert {"sweep", "bench"} <= set(plugins)
    assert {plugins[n].value for n in ("sweep", "bench")} == {"relay_amp.eval.commands:main"}


#: The pass's ground floor: helpers the builds may use (no decision of the pass lives there).
PASS_HELPERS = {"relay_amp.dtypes", "relay_amp.relax_utils", "relay_amp.execution"}


def test_the_builds_import_no_pass_stage():
    """relay_amp.builds compiles what the pass produces: it may use the pass's helpers, never a
    stage of the pass (transform, policy, planning, rewrite, report), nor the command or the
    harness."""
    builds = sorted((PACKAGE / "builds").rglob("*.py"))
    assert {p.name for p in builds} >= {"cpu_pipeline.py", "pipeline.py", "tensor_cores.py",
                                       "gpu_cost.py", "remote.py", "cuda.py"}
    offenders = {}
    for path in builds:
        imported = {n for n in _imported_modules(path) if n.startswith("relay_amp.")}
        outside = {n for n in imported if not n.startswith("relay_amp.builds")
                   and not any(n == h or n.startswith(h + ".") for h in PASS_HELPERS)}
        if outside:
            offenders[str(path.relative_to(PACKAGE))] = sorted(outside)
    assert offenders == {}


def test_the_builds_check_sees_a_pass_stage(tmp_path):
    probe = PACKAGE / "builds" / "_layout_probe.py"
    probe.write_text("from ..decide import decide_function\n")
    try:
        assert "relay_amp.decide" in _imported_modules(probe)
    finally:
        probe.unlink()
