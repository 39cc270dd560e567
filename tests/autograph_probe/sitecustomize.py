"""Python imports this at start-up in a process whose PYTHONPATH begins with this folder
(conftest.env_with_autograph_probe). At exit it appends to the file $AUTOGRAPH_PROBE the verb
and the functions AutoGraph converted in the process: each conversion loads a module named
__autograph_generated_file* (tensorflow/python/autograph/pyct/loader.py) whose factories
hold the converted code, tf__<name>. Its file is deleted at exit: only the process can tell."""

import atexit
import os
import sys
import types


def converted_names(code: types.CodeType):
    if code.co_name.startswith("tf__"):
        yield code.co_name[len("tf__"):]
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from converted_names(constant)


def converted_in(module: types.ModuleType) -> list[str]:
    """The functions one generated module holds; a converted lambda holds no tf__ name."""
    names = [name for value in vars(module).values() if isinstance(value, types.FunctionType)
             for name in converted_names(value.__code__)]
    return names or ["<lambda>"]


def append_converted() -> None:
    names = sorted(name for module_name, module in list(sys.modules.items())
                   if module_name.startswith("__autograph_generated_file") for name in converted_in(module))
    with open(os.environ["AUTOGRAPH_PROBE"], "a", encoding="utf-8") as out:
        out.write(" ".join(sys.argv[1:2] + names) + "\n")  # the verb, then what was converted


atexit.register(append_converted)
