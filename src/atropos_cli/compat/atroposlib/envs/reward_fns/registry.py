"""atroposlib.envs.reward_fns.registry: `registry`, the one `RewardRegistry` env files create rewards from.

- `@registry.register` (or `register(name=...)`) files a RewardFunction subclass under its lowercased class
  name less a trailing "reward" (`FormatReward` -> "format").
- `registry.create("format", **params)` or `registry.create({"type": "format", "weight": 2, "params": {...}})`
  (the dict's keys and `params` override `**params`) builds one; `registry.get(name)` gives the class or
  function. A name not registered yet is loaded from its module in this package, found as `NAME`,
  `NAME_reward` (a trailing `_reward` in NAME dropped first) or `NAME`, and filed under the name asked for:
  the alphabetically first RewardFunction class of that module, else its function `BASE`, `BASE_reward` or
  `format_reward` (wrapped in `LegacyFunctionWrapper`). That is atroposlib 0.4.0's rule, kept for identical
  scores: "r1" (and "r1_reward") give r1_reward.py's `AccuracyXReward`, not `R1Reward`. Each load runs the
  module again (its decorators re-register), as atroposlib's does.
- A name with no module, or a module that fails to import (a missing package: the error names it), is an
  ImportError "Failed to load reward function NAME: ...", as in atroposlib.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import sys
from collections.abc import Callable
from typing import Any, cast

from atropos_cli.compat.atroposlib.envs.reward_fns.reward_function import RewardFunction

__all__ = ["RewardRegistry", "LegacyFunctionWrapper", "registry"]

logger = logging.getLogger(__name__)
PACKAGES = {"math_verify": "math-verify", "latex2sympy2_extended": "latex2sympy2-extended", "scipy": "scipy"}


class RewardRegistry:
    def __init__(self) -> None:
        self._registry: dict[str, Any] = {}

    def register(self, cls: Any = None, name: str | None = None) -> Any:
        def _register(cls: Any) -> Any:
            if not inspect.isclass(cls) or not issubclass(cls, RewardFunction):
                raise TypeError(f"Class {getattr(cls, '__name__', cls)} is not a subclass of RewardFunction")
            key = name or cls.__name__.lower()
            self._registry[key.removesuffix("reward") if key.endswith("reward") else key] = cls
            return cls

        return _register if cls is None else _register(cls)

    def register_function(self, name: str, function: Any) -> None:
        self._registry[name] = function

    def create(self, name_or_config: str | dict[str, Any], **kwargs: Any) -> RewardFunction:
        if isinstance(name_or_config, str):
            kind, params = name_or_config, dict(kwargs)
        else:
            config = dict(name_or_config)
            kind = config.pop("type")
            config.update(config.pop("params", None) or {})
            params = {**kwargs, **config}
        found: Any = self.get(kind)
        if not inspect.isclass(found):
            return LegacyFunctionWrapper(found, **params)
        return cast(RewardFunction, found(**params))

    def get(self, name: str) -> Any:
        if name not in self._registry:
            self._load_reward_function(name)
        return self._registry[name]

    def _load_reward_function(self, name: str) -> None:
        base = name.removesuffix("_reward")
        try:
            module = _reward_module(name, base)
            classes = [
                obj
                for _, obj in inspect.getmembers(module, inspect.isclass)
                if issubclass(obj, RewardFunction) and obj is not RewardFunction
            ]
            if classes:
                self.register_function(name, classes[0])
                return
            for attribute in (base, f"{base}_reward", "format_reward"):
                if hasattr(module, attribute):
                    self.register_function(name, getattr(module, attribute))
                    return
            raise AttributeError(f"No reward function found in {module.__name__}")
        except Exception as exc:
            missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
            hint = f" (pip install {PACKAGES.get(missing, missing)})" if missing else ""
            raise ImportError(f"Failed to load reward function {name}: {exc}{hint}") from exc

    def list_registered(self) -> list[str]:
        return list(self._registry)

    def load_required_functions(self, config: Any) -> set[str]:
        """Load every reward a config names (datasets[*].reward_funcs / dataset_reward_funcs / types[*],
        and top-level reward_functions / reward_funcs, strings or {"type": ...} dicts)."""
        required: set[str] = set()
        for dataset in getattr(config, "datasets", None) or []:
            for field in ("dataset_reward_funcs", "reward_funcs"):
                required.update(getattr(dataset, field, None) or [])
            for kind in getattr(dataset, "types", None) or []:
                required.update(kind.get("reward_funcs", []) if isinstance(kind, dict) else [])
        for field in ("reward_functions", "reward_funcs"):
            for item in getattr(config, field, None) or []:
                if isinstance(item, str):
                    required.add(item)
                elif isinstance(item, dict) and "type" in item:
                    required.add(item["type"])
        for name in required:
            self.get(name)
        return required


def _reward_module(name: str, base: str) -> Any:
    package = __name__.rsplit(".", 1)[0]
    for candidate in (base, f"{base}_reward", name):
        if candidate.isidentifier() and importlib.util.find_spec(f"{package}.{candidate}") is not None:
            module_name = f"{package}.{candidate}"
            if module_name in sys.modules:
                return importlib.reload(sys.modules[module_name])
            return importlib.import_module(module_name)
    tried = ", ".join(f"{c}.py" for c in (base, f"{base}_reward", name))
    raise ImportError(f"No reward function file found for {name} (tried {tried})")


class LegacyFunctionWrapper(RewardFunction):
    """A function `f(completions, **kwargs) -> list | float` as a RewardFunction (a scalar is repeated)."""

    def __init__(self, func: Callable[..., Any], weight: float = 1.0, **kwargs: Any) -> None:
        super().__init__(weight=weight, **kwargs)
        self.func = func
        self._func_name = func.__name__

    @property
    def name(self) -> str:
        return self._func_name

    def compute(self, completions: list[Any], **kwargs: Any) -> list[float]:
        result = self.func(completions, **kwargs)
        return result if isinstance(result, list) else [result] * len(completions)


registry = RewardRegistry()

# An env file's `from atroposlib.envs.reward_fns.registry import ...` imports this module under the compat alias,
# and the import system then sets the package's `registry` attribute to the module, so a later
# `from atroposlib.envs.reward_fns import registry` binds this module instead of the object: the module answers
# the registry's calls too.
register = registry.register
register_function = registry.register_function
create = registry.create
get = registry.get
list_registered = registry.list_registered
load_required_functions = registry.load_required_functions
