"""TVMScript's ``T.prim_func`` for the tensor intrinsics the CPU rules register during a build.

``T.prim_func(...)`` calls ``inspect.stack()``, which reads the source line of every frame on
the stack; inside ``tvm.compile`` the stack is deep, and registering one intrinsic took 0.14 s
(profiled building yolov8n_320 for x86: 31 intrinsics, 4.5 s of its passes).
:data:`script` parses the same function without it: the function's own globals and closure
are all the names these intrinsics use. The parser reads ``s_tir=True`` off the decorator's
text, so it is written ``@script.prim_func(s_tir=True)``, the body in TVMScript's ``T``.
"""

from __future__ import annotations


class _Script:
    """``T.prim_func`` without the caller's stack."""

    @staticmethod
    def prim_func(s_tir: bool = False):  # noqa: ARG004 - the parser reads it off the source
        def parse(func):
            from tvm.script.parser._core import parse as parse_script
            from tvm.script.parser._core import utils

            parsed = parse_script(func, utils.inspect_function_capture(func))
            parsed.__name__ = func.__name__
            return parsed

        parse.dispatch_token = "tirx"  # what the parser dispatches the decorated function by
        return parse


script = _Script()

__all__ = ["script"]
