"""Plugins: modules or .py files imported before names are checked, so they can register RoPE methods
(`extend.register`) or tasks (`tasks.kit.declare`)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

from .config import ConfigError


def import_plugins(plugins: list[str]) -> None:
    """Import modules (dotted names) or .py files; they may register methods (extend.register) or tasks
    (tasks.kit.declare, or tasks.TASKS[name] = run). Also the env var ROPEBENCH_SWEEP_PLUGINS
    (comma-separated)."""
    env = [p for p in os.environ.get("ROPEBENCH_SWEEP_PLUGINS", "").split(",") if p.strip()]
    for spec in dict.fromkeys([*env, *plugins]):
        spec = spec.strip()
        if not spec:
            raise ConfigError(
                "--plugin '' names no plugin — give a module name or a .py file (or drop --plugin)"
            )
        try:
            if spec.endswith(".py"):
                path = Path(spec).expanduser().resolve()
                if not path.is_file():
                    raise ConfigError(f"plugin file not found: {spec} — check the path")
                name = f"ropebench_plugin_{path.stem}"
                if name in sys.modules:
                    continue
                module_spec = importlib.util.spec_from_file_location(name, path)
                module = importlib.util.module_from_spec(module_spec)
                sys.modules[name] = module
                try:
                    module_spec.loader.exec_module(module)
                except BaseException:
                    sys.modules.pop(name, None)  # a broken plugin is not half-imported on a retry
                    raise
            else:
                importlib.import_module(spec)
        except ConfigError:
            raise
        except (
            SystemExit,
            KeyboardInterrupt,
        ) as e:  # a plugin's exit() or raise KeyboardInterrupt: not ours to obey
            what = f"called sys.exit({e.code!r})" if isinstance(e, SystemExit) else "raised KeyboardInterrupt"
            raise ConfigError(
                f"plugin {spec!r} {what}{_where(e)} while being imported — fix the plugin (or drop "
                f"--plugin {spec})"
            ) from None
        except ModuleNotFoundError as e:
            raise ConfigError(f"plugin {spec!r} could not be imported: {e} — check the module name") from None
        except SyntaxError as e:
            where = f"{Path(e.filename).name}:{e.lineno}" if e.filename else f"line {e.lineno}"
            raise ConfigError(
                f"plugin {spec!r} has a syntax error ({where}: {e.msg}) — fix the plugin file"
            ) from None
        except Exception as e:  # noqa: BLE001 - a plugin's own bug: name it, no traceback
            first = (str(e).strip().splitlines() or [""])[0]
            raise ConfigError(
                f"plugin {spec!r} raised {type(e).__name__}{_where(e)}: {first} — fix the plugin (or "
                f"drop --plugin {spec})"
            ) from None


def _where(e: BaseException) -> str:
    """Where ``e`` was raised, as " at file.py:line" (the innermost frame: the plugin's own line)."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return f" at {Path(tb.tb_frame.f_code.co_filename).name}:{tb.tb_lineno}" if tb is not None else ""
