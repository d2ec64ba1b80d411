"""Constructs Atropos env files the way `python ENV.py process` does before its first request: import the file,
`config_init()`, then the env class built with those configs. Runs under atroposlib 0.4.0 (its venv) or, with
`--ours`, under our compatibility layer (`import atroposlib` resolved by our alias finder). Standard library
only at module level, so the same file runs in both interpreters.

Usage: `python atropos_corpus_driver.py [--ours] SDIST_ROOT TOKENIZER_DIR FILE...` (FILE relative to
SDIST_ROOT/environments); prints one JSON line per file: {"file", "status", "classes", "error"}, status one of
`ok` (every env class defined there constructed), `no-env` (the file defines no env class: a helper, a launcher
or a test), `error` (the first failure, one line, with the file:line it was raised at).
"""

import asyncio
import importlib.util
import inspect
import json
import os
import signal
import sys
import traceback

PER_FILE_S = 60


class _Timeout(Exception):
    pass


def _alarm(*_):
    raise _Timeout(f"took over {PER_FILE_S}s")


def _where(exc, path):
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if os.path.abspath(f.filename) == os.path.abspath(path)]
    frame = own[-1] if own else (frames[-1] if frames else None)
    if frame is None:
        return ""
    return f" (at {os.path.basename(frame.filename)}:{frame.lineno})"


def _describe(exc, path):
    hint = getattr(exc, "hint", None)  # our errors carry a hint
    text = getattr(exc, "message", None) or " ".join(str(exc).split())[:400]
    return f"{type(exc).__name__}: {text}{_where(exc, path)}" + (f" (hint: {hint})" if hint else "")


def _import(path, index):
    """The file as a module; a file with relative imports (`from .x import y`) as a member of its folder's
    package, the way `python -m folder.file` runs it."""
    folder = os.path.dirname(path)
    stem = os.path.splitext(os.path.basename(path))[0]
    try:
        return _exec(path, f"atropos_corpus_env_{index}", folder)  # its folder on sys.path, as `python FILE`
    except ImportError as exc:
        if "no known parent package" not in str(exc):
            raise
    sys.path.insert(0, os.path.dirname(folder))
    try:  # the package first (its __init__ may import this very module), then the module in it
        return importlib.import_module(f"{os.path.basename(folder)}.{stem}")
    finally:
        sys.path.remove(os.path.dirname(folder))


def _import_ours(path):
    """Our loader's import (`atropos process FILE`): its error is one line naming file:line and what is missing."""
    from pathlib import Path

    from atropos_cli.env.registry import _import_file

    return _import_file(Path(path))


def _exec(path, name, search_dir):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, search_dir)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    finally:
        sys.path.remove(search_dir)
    return module


def _env_classes(module, base_env):
    """The env classes the file defines; an abstract one that another class there extends is a base, not an env
    (an abstract leaf stays: atroposlib cannot build it, and that is a finding)."""
    found = [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj)
        and issubclass(obj, base_env)
        and obj is not base_env
        and obj.__module__ == module.__name__
    ]
    return [c for c in found if not (inspect.isabstract(c) and any(o is not c and issubclass(o, c) for o in found))]


async def _construct(cls, tokenizer, path, ours):
    """atroposlib: `config_init()`, the tokenizer set as `--env.tokenizer_name` sets it, then the class built
    with those configs. Ours: exactly what `atropos process FILE --env.tokenizer_name DIR` does before its
    first request (our loader: config_init, flags, the class's build)."""
    if ours:
        from atropos_cli.env.loading import load_env

        flags = ["--env.tokenizer_name", tokenizer, "--env.use_wandb", "false"]
        flags += ["--openai.base_url", "http://127.0.0.1:9/v1", "--openai.model_name", "fake-model"]
        loaded = load_env(path, flags, None, {}, mode="process", env_cls=cls)
        return type(loaded.env).__name__
    config, servers = cls.config_init()
    config.tokenizer_name = tokenizer
    config.use_wandb = False
    env = cls(config=config, server_configs=servers, slurm=False, testing=False)  # as its CLI does
    return type(env).__name__


def run_file(root, rel, index, tokenizer, ours):
    from atroposlib.envs.base import BaseEnv

    path = os.path.join(root, "environments", rel)
    result = {"file": rel, "status": "ok", "classes": [], "error": None}
    signal.alarm(PER_FILE_S)
    try:
        module = _import_ours(path) if ours else _import(path, index)
        classes = _env_classes(module, BaseEnv)
        if not classes:
            result["status"] = "no-env"
        for cls in classes:
            result["classes"].append(asyncio.run(_construct(cls, tokenizer, path, ours)))
    except BaseException as exc:  # noqa: BLE001 - every failure becomes one line of data
        result.update(status="error", error=_describe(exc, path))
    finally:
        signal.alarm(0)
    return result


def main(argv):
    ours = argv[:1] == ["--ours"]
    if ours:
        argv = argv[1:]
        from atropos_cli.env.aliases import install_aliases

        install_aliases()
    root, tokenizer, files = argv[0], argv[1], argv[2:]
    sys.path.insert(0, root)  # files import `environments.x.y` from the sdist's root
    os.environ.setdefault("WANDB_MODE", "disabled")
    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "NOUS_API_KEY"):  # judges read keys at construction
        os.environ.setdefault(key, "x")
    import atropos_corpus_data

    atropos_corpus_data.install()  # datasets loaded by name at construction get the stand-in rows
    signal.signal(signal.SIGALRM, _alarm)
    out = sys.stdout
    sys.stdout = sys.stderr  # env code prints; only our JSON lines go to stdout
    for index, rel in enumerate(files):
        before = set(sys.modules)
        out.write(json.dumps(run_file(root, rel, index, tokenizer, ours)) + "\n")
        out.flush()
        _forget_modules(root, before)


def _forget_modules(root, before):
    """Drop the modules a file brought in from the sdist (`src`, `utils`, ... are common names), so the next
    file imports its own: each file runs alone under `python FILE`."""
    for name in set(sys.modules) - before:
        attrs = getattr(sys.modules.get(name), "__dict__", None) or {}  # never a module's own __getattr__
        path = attrs.get("__path__")
        path = getattr(path, "__dict__", {}).get("_path", path)  # a namespace package's own list
        places = [attrs.get("__file__") or "", *(path if isinstance(path, list) else [])]
        if any(isinstance(place, str) and place.startswith(root) for place in places):
            sys.modules.pop(name, None)


if __name__ == "__main__":
    main(sys.argv[1:])
