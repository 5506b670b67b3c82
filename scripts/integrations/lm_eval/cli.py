"""`ropebench lm-eval ...`: lm-eval's own CLI with the `ropebench` model registered."""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from pathlib import Path

from ropebench import extend
from ropebench.extend.errors import ExtendError, RopebenchError

from .data import data_checked_before_the_model
from .model import (
    DEFAULT_PRETRAINED,
    LM_EVAL_RANGE,
    LM_EVAL_VERSION,
    MODEL_NAME,
    check_model_args,
    tokenizer_source,
    typed_model_args,
)

# --- task folder -----------------------------------------------------------------------------------------


def checked_tasks_dir(tasks_dir) -> Path:
    """The folder of ropebench's lm-eval tasks, as the caller passes it (the core never looks above itself:
    `ropebench lm-eval` passes tasks.lm_eval_export.OUT_DIR)."""
    if tasks_dir is None:
        raise ExtendError(
            "`python -m ropebench.integrations.lm_eval` knows no task folder of ropebench's — "
            "`ropebench lm-eval tasks` prints it (in Python: tasks.lm_eval_export.OUT_DIR)"
        )
    if not Path(tasks_dir).is_dir():
        raise ExtendError(
            f"{tasks_dir} is missing — generate it with `python -m ropebench.tasks.lm_eval_export`"
        )
    return Path(tasks_dir)


def needs_snapshot(model_args: dict, metadata: dict | None) -> bool:
    """Would `with_task_tokenizer` convert a GGUF file first
    (its snapshot not cached yet: seconds to a minute)?"""
    from ropebench.extend.loading import _snapshot_dir, check_model_spec

    if "tokenizer" in model_args or "tokenizer" in (metadata or {}):
        return False
    spec = check_model_spec(str(model_args.get("pretrained", DEFAULT_PRETRAINED)))
    if spec not in extend.ALIASES and not spec.endswith(".gguf"):
        return False
    path = extend.embedded_gguf(spec) if spec in extend.ALIASES else Path(spec).expanduser()
    return not (_snapshot_dir(path) / "config.json").is_file()


def check_task_names(tasks, include_path) -> None:
    """lm-eval's own task-name check (its ValueError "Tasks not found: ..."), run early: a mistyped name is
    refused before the model's weights are converted or loaded."""
    names = [t for t in (tasks or []) if isinstance(t, str) and not t.endswith(".yaml")]
    if not names:
        return
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=include_path)
    missing = [t for t in names if not manager.match_tasks([t])]
    if missing:
        raise ValueError(f"Tasks not found: {', '.join(missing)}")


def with_task_tokenizer(model_args: dict, metadata: dict | None) -> dict | None:
    """The task metadata of a `ropebench` run, with `tokenizer` set when the model is an alias or a .gguf
    file. lm-eval hands model_args to tasks as metadata, and tasks that size their own prompts (RULER's) load
    `tokenizer`, else `pretrained`, with AutoTokenizer, which cannot read an alias or a GGUF: they get the
    folder of the snapshot extend.load reads. The model itself keeps the tokenizer extend.load gives it."""
    if "tokenizer" in model_args or "tokenizer" in (metadata or {}):
        return metadata
    pretrained = str(model_args.get("pretrained", DEFAULT_PRETRAINED))
    if pretrained not in extend.ALIASES and not pretrained.endswith(".gguf"):
        return metadata
    return {**(metadata or {}), "tokenizer": tokenizer_source(pretrained)}


# --- CLI shim --------------------------------------------------------------------------------------------

USAGE = """usage: ropebench lm-eval {run,ls,validate} [lm-eval arguments ...]
       ropebench lm-eval tasks        print the folder of ropebench's lm-eval tasks
       ropebench lm-eval tokenizer [PRETRAINED]   print the tokenizer folder (or hub id) of a model
                                      (default smollm2-135m), for model_args/metadata tokenizer=

Runs lm-eval's own CLI with the `ropebench` model registered; every lm-eval flag works. Without
--include_path, ropebench's task folder is included. (`python -m ropebench.integrations.lm_eval ...`
is the same CLI without ropebench's task folder.) Offline, tasks whose data is not cached are refused before
the model loads.
Example:
  ropebench lm-eval run --model ropebench --model_args pretrained=smollm2-135m,method=yarn,factor=2 \\
      --tasks ropebench_passkey_16k --limit 4 --device cpu
"""


def _parse(parser) -> argparse.Namespace:
    """lm-eval's own parsing (it inserts 'run' when no subcommand is given); its usage errors (argparse's
    usage block and exit 2) become the project's one line."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            args = parser.parse_args()
    except SystemExit as e:
        if not e.code:  # --help: printed, done
            raise
        said = [line.split("error: ", 1)[1] for line in captured.getvalue().splitlines() if "error: " in line]
        raise RopebenchError(
            f"{said[-1] if said else 'bad arguments'} — `ropebench lm-eval --help` shows the commands, "
            f"`ropebench lm-eval run --help` lm-eval's options"
        ) from None
    sys.stderr.write(captured.getvalue())
    return args


def owned_output(args: argparse.Namespace):
    """lm-eval writes results_*.json and samples_*.jsonl under --output_path (or, for a path ending in .json,
    beside it): only into a new or empty folder or one ropebench made (extend/owned_paths.py, the rule of
    every writer), checked before the model loads. Returns (the folder, its files now) or None."""
    from ropebench.extend.owned_paths import OwnedDir

    path = getattr(args, "output_path", None)
    if getattr(args, "command", None) != "run" or not path:
        return None
    root = Path(path).parent if Path(path).suffix == ".json" else Path(path)
    owned = OwnedDir.open(root, "--output_path folder", error=ExtendError)
    return owned, owned.existing()


def main(argv: list[str] | None = None, *, tasks_dir=None) -> int:
    """`ropebench lm-eval ...`: lm-eval's CLI with the `ropebench` model registered. `tasks_dir`: the folder
    of ropebench's lm-eval tasks (included when the command names no --include_path), passed by the caller."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    if argv[0] in ("tasks", "--print-tasks-path", "tokenizer"):
        try:
            print(checked_tasks_dir(tasks_dir) if argv[0] != "tokenizer" else tokenizer_source(*argv[1:2]))
        except RopebenchError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    try:
        from lm_eval._cli import HarnessCLI
    except ImportError:
        print(
            f"error: lm-eval {LM_EVAL_VERSION} has no lm_eval._cli (new in 0.4.10), which this command "
            f"drives — install 'lm-eval{LM_EVAL_RANGE}'",
            file=sys.stderr,
        )
        return 2
    from lm_eval.utils import setup_logging

    setup_logging()
    parser = HarnessCLI()
    saved = sys.argv
    sys.argv = ["lm-eval", *argv]
    try:
        args = _parse(parser)
        if getattr(args, "command", None) == "run":
            if getattr(args, "include_path", None) is None and not getattr(args, "config", None):
                args.include_path = None if tasks_dir is None else str(checked_tasks_dir(tasks_dir))
            if getattr(args, "model", None) == MODEL_NAME:
                args.model_args = typed_model_args(argv, args.model_args)
                check_model_args(dict(args.model_args or {}))
                if needs_snapshot(dict(args.model_args or {}), args.metadata):
                    check_task_names(args.tasks, args.include_path)  # before converting a GGUF's weights
                args.metadata = with_task_tokenizer(dict(args.model_args or {}), args.metadata)
        output = owned_output(args)  # a folder of the user's is refused before the model loads
        with data_checked_before_the_model():
            parser.execute(args)
        if output is not None:  # what lm-eval wrote, listed in the folder's marker
            output[0].record(sorted(output[0].existing() - output[1]))
    except RopebenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:  # lm-eval checks the task names before it loads the model
        if not str(e).startswith("Tasks not found"):
            raise
        print(
            f"error: lm-eval {str(e)[0].lower()}{str(e)[1:]} — check the names (`ropebench lm-eval ls tasks` "
            f"lists them; ropebench's are ropebench_*)",
            file=sys.stderr,
        )
        return 2
    finally:
        sys.argv = saved
    return 0
