"""The FLOP formulas a counting uses, by aten operator: torch's own table, and gputop's for what it lacks.

``torch.utils.flop_counter.flop_registry`` has a formula for the matrix multiplications, convolutions and their
backward, and the fused attention kernels (and whatever a script registered into it); ``formulas()`` adds the
few ``EXTRA_FORMULAS`` torch's table lacks (the CPU's fused attention, ``_addmm_activation``, ``addbmm``) and
faster ones for the matrix multiplications it has.  A formula reads shapes only (``shape_of``), never data: a
counting never synchronises.  The dispatch mode that calls them is ``flop_mode.py``.  This module imports torch
only inside functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def shape_of(value: Any) -> Any:
    """A formula's view of an operator's argument or output, as torch's ``shape_wrapper`` gives it: a tensor's
    shape, a list or tuple with its tensors' shapes, anything else as it is (no pytree walk: ~1 µs, not ~20)."""
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "dtype"):
        return shape
    if type(value) is list or type(value) is tuple:
        return type(value)(shape_of(item) for item in value)
    return value


def shapes(args: Any) -> list[Any]:
    return [shape_of(arg) for arg in args]


def shape_kwargs(kwargs: Any) -> dict[str, Any]:
    return {name: shape_of(value) for name, value in kwargs.items()} if kwargs else {}


_TABLE: dict[Any, tuple[Any, bool]] | None = None
_TABLE_SIZE = -1
PLANS: dict[int, dict[Any, Any]] = {}  # each operator's plan, by the table it was made from


def formula_table() -> dict[Any, tuple[Any, bool]]:
    """Every formula a counting uses, by operator: (formula, called with shapes).  torch's table (and what a script
    registered into it), read again when it has grown, then ``formulas()`` for the operators it lacks and for
    the matrix multiplications it has, whose formulas call each other through the shape wrapper's pytree walk
    (~35 µs an operator; these count the same in a microsecond)."""
    global _TABLE, _TABLE_SIZE
    from torch.utils import flop_counter

    registry: Mapping[Any, Any] = flop_counter.flop_registry
    if _TABLE is not None and len(registry) == _TABLE_SIZE:
        return _TABLE
    wrapped_code = flop_counter.shape_wrapper(shapes).__code__
    table: dict[Any, tuple[Any, bool]] = {}
    for target, formula in registry.items():
        inner = getattr(formula, "__wrapped__", None)
        if inner is not None and getattr(formula, "__code__", None) is wrapped_code:
            table[target] = (inner, True)
        else:
            table[target] = (formula, False)
    for target, formula in formulas().items():
        table[target] = (formula, True)
    _TABLE, _TABLE_SIZE = table, len(registry)
    PLANS.clear()
    return table


def _mm(a: Any, b: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    m, k = a
    return int(2 * m * k * b[1])  # torch.utils.flop_counter.mm_flop's count


def _addmm(bias: Any, a: Any, b: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return _mm(a, b)


def _bmm(a: Any, b: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    batch, m, k = a
    return int(2 * batch * m * k * b[2])  # torch.utils.flop_counter.bmm_flop's count


def _baddbmm(bias: Any, a: Any, b: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return _bmm(a, b)


_EXTRA: dict[Any, Any] | None = None


def formulas() -> dict[Any, Any]:
    """gputop's own formulas, called with shapes (``EXTRA_FORMULAS`` by name): the operators torch's table lacks
    (the CPU's fused attention and its backward, ``_addmm_activation``, ``addbmm``) and the matrix
    multiplications it has, each the same count torch's table gives (tests/unit/test_flops.py compares them).
    """
    global _EXTRA
    if _EXTRA is not None:
        return _EXTRA
    extra: dict[Any, Any] = {}
    try:
        import torch
        from torch.utils import flop_counter

        aten = torch.ops.aten

        def cpu_sdpa(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
            return int(flop_counter.sdpa_flop_count(query, key, value))

        def cpu_sdpa_backward(
            grad_out: Any, query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any
        ) -> int:
            return int(flop_counter.sdpa_backward_flop_count(grad_out, query, key, value))

        for name, formula in (
            ("mm", _mm),
            ("addmm", _addmm),
            ("_addmm_activation", _addmm),
            ("bmm", _bmm),
            ("baddbmm", _baddbmm),
            ("addbmm", _baddbmm),
            ("_scaled_dot_product_flash_attention_for_cpu", cpu_sdpa),
            ("_scaled_dot_product_flash_attention_for_cpu_backward", cpu_sdpa_backward),
        ):
            packet = getattr(aten, name, None)
            if packet is not None:
                extra[packet] = formula
    except Exception:
        pass  # an older torch without these operators or helpers: torch's table alone
    _EXTRA = extra
    return extra


EXTRA_FORMULAS = (
    "aten._scaled_dot_product_flash_attention_for_cpu",
    "aten._scaled_dot_product_flash_attention_for_cpu_backward",
    "aten._addmm_activation",
    "aten.addbmm",
)
