"""Where each parameter of a wrapped model sits, as it was wrapped: the replacements torch makes
past its registration hooks.

The reducer hooks each parameter object (reducer.py), and distributed.py hears of parameters
registered in the tree later through torch's registration hooks. Two of torch's own roads pass
both by:

- under ``torch.__future__.set_overwrite_module_params_on_conversion(True)``, ``.to()``,
  ``.double()`` and the like write new Parameter objects straight into each module's
  ``_parameters``;
- under ``set_swap_module_params_on_conversion(True)`` (``.to()``, ``load_state_dict``), and in
  any call of ``torch.utils.swap_tensors``, the parameter object stays and the tensor behind it
  is swapped, the hooks staying with the old one.

Either way the new tensors' gradients reached no bucket: with ``find_unused_parameters=True``
the old ones just looked unused, and each replica trained on its own gradients (6.6 on rank 0,
13.3 on rank 1 for one weight's sum). ``Places.moved`` finds both in one pass per forward: the
object in each ``_parameters`` slot, and the TensorImpl behind it (``Tensor._cdata``); about
6 us per 100 parameters.
"""
from __future__ import annotations

import operator

_impl = operator.attrgetter("_cdata")   # the address of the TensorImpl behind a tensor


class Places:
    def __init__(self, module):
        rows = [(m._parameters, n, p, f"{prefix}.{n}" if prefix else n)
                for prefix, m in module.named_modules() for n, p in m._parameters.items() if p is not None]
        self.dicts, self.names, self.params, self.labels = (list(c) for c in zip(*rows)) if rows else ([], [], [], [])
        self.impls = list(map(_impl, self.params))

    def moved(self) -> bool:
        """Whether some parameter was replaced in its module or swapped since wrapping."""
        return (list(map(_impl, self.params)) != self.impls
                or any(map(operator.is_not, map(dict.get, self.dicts, self.names), self.params)))

    def changes(self) -> list:
        """(row, label, the parameter wrapped, what is there now or None, how) for each one moved."""
        found = []
        for row, (d, name, old, label, impl) in enumerate(zip(self.dicts, self.names, self.params, self.labels,
                                                             self.impls)):
            now = d.get(name)
            if now is None:
                found.append((row, label, old, None, "removed"))
            elif now is not old:
                found.append((row, label, old, now, "replaced by a new Parameter"))
            elif _impl(now) != impl:
                found.append((row, label, old, now, "swapped for another tensor"))
        return found

    def adopt(self, rows) -> None:
        """Take what now sits in ``rows`` as wrapped (frozen parameters replaced by frozen ones),
        forgetting the rows whose parameter was removed."""
        rows = set(rows)
        kept = [(d, n, d.get(n) if i in rows else p, label)
                for i, (d, n, p, label) in enumerate(zip(self.dicts, self.names, self.params, self.labels))]
        kept = [r for r in kept if r[2] is not None]
        self.dicts, self.names, self.params, self.labels = (list(c) for c in zip(*kept)) if kept else ([], [], [], [])
        self.impls = list(map(_impl, self.params))
