"""torch.compile and the hooks gputop puts in a model: invisible to dynamo, and still run where the model runs.

Dynamo traces a compiled module's ``__call__`` whole, its forward hooks with it, and the autograd hooks under
compiled autograd.  Traced, a hook of gputop's would be compiled into the user's graph: its reads of gputop's
state become guards (``side.train_forwards == 0``, the value a clock returned), each step fails one, and the job
recompiles until dynamo gives up (docs/decisions.md, "A compiled model is never traced into").  So every hook and
callback gputop registers begins with ``if compiled.compiling(): return``: torch's own question, bound here once
torch is imported.  Dynamo folds that call to True and the hook to nothing: no operation, no guard (but on which
function the name holds), no graph break, also under ``fullgraph=True``.  Eagerly it is one call of ~50 ns
(``torch.compiler.is_dynamo_compiling`` returns False).

A hook folded away does not run, so a model compiled after it was watched would lose its forward marks.
``CompileWatch`` wraps ``torch.compile`` and, when the model compiled is the watched one, puts the same hooks
where they run eagerly: on the ``OptimizedModule`` that ``torch.compile(model)`` returns, and around the
compiled ``_call_impl`` that ``model.compile()`` stores.  A model compiled before it was watched needs nothing:
``watch`` hooks the wrapper it is given.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import weakref
from collections.abc import Callable
from typing import Any


def _never() -> bool:
    return False


# Whether dynamo is tracing the code that asks (always False eagerly): every hook of gputop's asks first, as
# ``compiled.compiling()`` (a module attribute: ``learn_compiling`` rebinds it to torch's own function).
compiling: Callable[[], bool] = _never


def learn_compiling() -> None:
    """Bind ``compiling`` to this torch's own question where torch is imported (before anything is compiled); else
    leave it as it is.

    ``torch.compiler.is_dynamo_compiling`` (a bare ``return False``, 2.4 on), else ``torch.compiler.is_compiling``
    (2.3), else ``torch._utils.is_compiling``: dynamo folds each to True.
    """
    global compiling
    torch = sys.modules.get("torch")
    if torch is None:
        return
    compiler = getattr(torch, "compiler", None)
    for found in (
        getattr(compiler, "is_dynamo_compiling", None),
        getattr(compiler, "is_compiling", None),
        getattr(getattr(torch, "_utils", None), "is_compiling", None),
    ):
        if callable(found):
            compiling = found
            return


# Called with (the module compiled, what torch.compile returned); returns what the caller is to get.
OnCompiled = Callable[[Any, Any], Any]
# Every reporter's callback, weakly (a process has one reporter; tests make many): ``torch.compile`` is wrapped once.
_watchers: list[weakref.WeakMethod[OnCompiled]] = []


def _tell_watchers(model: Any, result: Any) -> Any:
    for ref in list(_watchers):
        on_compiled = ref()
        if on_compiled is None:
            _watchers.remove(ref)
            continue
        made = on_compiled(model, result)
        if made is not result:  # the watched model was compiled: one reporter watches it
            return made
    return result


class CompileWatch:
    """``torch.compile`` wrapped once a model is watched, so the watched model's compiled forms get its hooks."""

    def __init__(self, on_compiled: OnCompiled) -> None:
        self._on_compiled = on_compiled  # a bound method, held weakly by the wrapper

    def install(self) -> bool:
        """Wrap ``torch.compile`` (torch imported) if no reporter has, and tell this one of what it compiles; False
        where ``torch.compile`` is not there."""
        torch = sys.modules.get("torch")
        original = getattr(torch, "compile", None)
        if not callable(original):
            return False
        if not any(ref() == self._on_compiled for ref in _watchers):
            _watchers.append(weakref.WeakMethod(self._on_compiled))
        if hasattr(original, "__gputop_original__"):
            return True

        @functools.wraps(original)
        def compile(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            try:
                model = args[0] if args else kwargs.get("model")
                return _tell_watchers(model, result) if model is not None else result
            except Exception:
                return result

        compile.__gputop_original__ = original  # type: ignore[attr-defined]
        torch.compile = compile  # type: ignore[union-attr]
        return True


WRAPPER, CALL = "wrapper", "call"


def form_of(model: Any, compiled: Any, result: Any) -> str | None:
    """What ``torch.compile(compiled)`` made of the watched ``model``: ``WRAPPER``, the ``OptimizedModule`` of
    ``torch.compile(model)``; ``CALL``, the compiled ``_call_impl`` that ``model.compile()`` keeps; None where
    something else was compiled.

    Either way the model's forward hooks are to move: left on it, dynamo would compile each as a frame of its own
    (to nothing: ``compiling()``), with guards checked on every call, and name gputop's file among the job's
    compiles.  On the wrapper, or around the compiled call, they run eagerly.
    """
    if model is None:
        return None
    if getattr(result, "_orig_mod", None) is model:
        return WRAPPER
    if getattr(compiled, "__self__", None) is model and getattr(compiled, "__name__", "") == "_call_impl":
        return CALL
    return None


def compiled_call(
    compiled: Callable[..., Any],
    module: Any,
    pre: list[Callable[[Any, Any, Any], None]],
    post: list[Callable[[Any, Any, Any], None]],
) -> Callable[..., Any]:
    """``model.compile()``'s compiled ``_call_impl`` with the watched model's forward hooks run around it, eagerly:
    ``pre`` as (module, args, kwargs), ``post`` as (module, args, output).  A hook's failure never reaches the
    forward (a hook torch calls is as careful)."""

    @functools.wraps(compiled)
    def call(*args: Any, **kwargs: Any) -> Any:
        for hook in pre:
            with contextlib.suppress(Exception):
                hook(module, args, kwargs)
        output = compiled(*args, **kwargs)
        for hook in post:
            with contextlib.suppress(Exception):
                hook(module, args, output)
        return output

    call.__gputop_compiled__ = compiled  # type: ignore[attr-defined]
    return call
