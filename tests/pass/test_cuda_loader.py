"""relay_amp.cuda_loader: what a GPU host with TVM's runtime alone imports to load a relay_amp
CUDA library. It must load without relay_amp and without numpy (copied alone beside a script)."""

import ast
import pathlib
import subprocess
import sys

import pytest

from relay_amp import cuda_loader

SOURCE = pathlib.Path(cuda_loader.__file__)


def test_it_imports_the_standard_library_alone():
    tree = ast.parse(SOURCE.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "a relative import would need the package"
            imported.add(node.module.split(".")[0])
    assert imported <= set(sys.stdlib_module_names) | {"__future__", "tvm_ffi", "tvm"}
    assert "numpy" not in imported and "relay_amp" not in imported


def test_copied_alone_it_imports_without_site_packages(tmp_path):
    (tmp_path / "cuda_loader.py").write_text(SOURCE.read_text())
    result = subprocess.run([sys.executable, "-S", "-c", "import cuda_loader, sys; "
                             "print(callable(cuda_loader.enable_cuda), 'numpy' in sys.modules)"],
                            cwd=tmp_path, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "False"]


def test_without_a_gpu_the_error_says_what_is_missing():
    import tvm

    if tvm.cuda(0).exist:
        pytest.skip("a CUDA GPU is visible here: the GPU bundle's run covers this path")
    with pytest.raises(RuntimeError, match="CUDA"):
        cuda_loader.enable_cuda(tvm, "nvrtc")
