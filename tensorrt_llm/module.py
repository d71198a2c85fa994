"""`Module` and `ModuleList`: the model-definition tree.

Assigning a Parameter or Module to an attribute registers it, so every parameter gets a
hierarchical name (`transformer.layers.0.attention.qkv.weight`) matching checkpoint
names. Calling a module runs `forward` with its path as the name scope of the layers it
adds.
"""
from __future__ import annotations

from typing import Iterator, Optional

from .errors import CheckpointError
from .network import current_net
from .parameter import Parameter


class Module:

    def __init__(self):
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_parent", None)
        object.__setattr__(self, "_name_in_parent", None)

    def __setattr__(self, name, value):
        if "_modules" not in self.__dict__:
            raise RuntimeError(f"{type(self).__name__}: call super().__init__() before assigning attributes")
        self._modules.pop(name, None)
        self._parameters.pop(name, None)
        if isinstance(value, Parameter):
            self._parameters[name] = value
            value._register(self, name)
        elif isinstance(value, Module):
            self._modules[name] = value
            if value._parent is None and value is not self:
                object.__setattr__(value, "_parent", self)
                object.__setattr__(value, "_name_in_parent", name)
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        self._modules.pop(name, None)
        self._parameters.pop(name, None)
        object.__delattr__(self, name)

    @property
    def full_name(self) -> str:
        """Dotted path from the root module ('' for the root)."""
        parts, m = [], self
        while m._parent is not None:
            parts.append(m._name_in_parent)
            m = m._parent
        return ".".join(reversed(parts))

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__}.forward")

    def __call__(self, *args, **kwargs):
        net = current_net()
        if net is None:
            return self.forward(*args, **kwargs)
        with net.name_scope(self.full_name):
            return self.forward(*args, **kwargs)

    def named_children(self) -> Iterator[tuple[str, "Module"]]:
        yield from self._modules.items()

    def children(self) -> Iterator["Module"]:
        yield from self._modules.values()

    def named_modules(self, prefix: str = "", _seen: Optional[set] = None) -> Iterator[tuple[str, "Module"]]:
        seen = set() if _seen is None else _seen
        if id(self) in seen:
            return
        seen.add(id(self))
        yield prefix, self
        for name, child in self._modules.items():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name, seen)

    def modules(self) -> Iterator["Module"]:
        for _, m in self.named_modules():
            yield m

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Parameter]]:
        """Every parameter once (a shared one under its first name in traversal order)."""
        seen = set()
        for module_name, module in self.named_modules(prefix):
            for name, p in module._parameters.items():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield (f"{module_name}.{name}" if module_name else name), p

    def parameters(self) -> Iterator[Parameter]:
        for _, p in self.named_parameters():
            yield p

    def load(self, weights: dict, strict: bool = True) -> None:
        """Bind weights by hierarchical name. Every problem (each missing and each
        unexpected name when strict, each shape/dtype mismatch) is reported in one error."""
        params = dict(self.named_parameters())
        problems = []
        if strict:
            problems += [f"missing: {n}" for n in params if n not in weights]
            problems += [f"unexpected: {n}" for n in weights if n not in params]
        for name, p in params.items():
            if name in weights:
                try:
                    p.value = weights[name]
                except (ValueError, TypeError) as e:
                    problems.append(str(e))
        if problems:
            raise CheckpointError(f"{type(self).__name__}.load: {len(problems)} problem(s):\n  "
                                  + "\n  ".join(problems))


class ModuleList(Module):

    def __init__(self, modules=()):
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, module: Module) -> None:
        setattr(self, str(len(self._modules)), module)

    def __getitem__(self, index):
        items = list(self._modules.values())
        return items[index]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(list(self._modules.values()))
