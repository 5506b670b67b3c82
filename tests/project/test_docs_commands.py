"""Every command the README and the docs show is one the code accepts. Each `ropebench ...`, `python -m
ropebench...`, `python scripts/*.py`, `python benchmarks/run.py` and `accelerate launch ... scripts/sweep.py`
line of a code block is parsed by the real command's own argument parser (nothing runs: the first complete
parse stops it); a command named in running text (an inline code span, often a command with one flag) has its
subcommand and every `--flag` it names in that command's help; each `bash scripts/...` names a script that
exists. A flag renamed in the code fails here until the docs follow. A placeholder (`...`, `RUN_DIR`, `NAME`)
ends what is parsed. docs/bad-input.md is left out: its table is generated from the cases of
tests/project/test_bad_inputs.py, each run there.
"""

import argparse
import importlib
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "benchmarks").glob("*.md")),
]
DOCS.remove(ROOT / "docs" / "bad-input.md")
PROGRAM = re.compile(r"(\S+=\S+ )*(\S*/)?(ropebench|python|bash|accelerate) ")
# a checkout script -> the module whose main(argv) it runs
SCRIPTS = {
    "scripts/sweep.py": "ropebench.sweep_lib",
    "benchmarks/run.py": "ropebench.benchmarks.run",
    "scripts/measure_tasks.py": "ropebench.measure_tasks",
}
NOT_OURS = ("nltk.", "pip")  # other programs the docs show (python -m nltk.downloader, pip)


def documented_commands() -> list[tuple[str, str, bool]]:
    """(file, command, in a code block) for each command line in a code block or inline code span."""
    found = {}
    for path in DOCS:
        text = path.read_text()
        blocks = [
            (line.strip(), True)
            for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.DOTALL)
            for line in block.replace("\\\n", " ").splitlines()
        ]
        spans = [
            (span, False)
            for span in re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.DOTALL))
        ]
        for line, full in blocks + spans:
            if PROGRAM.match(line):
                found.setdefault((line, full), path.relative_to(ROOT).as_posix())
    return sorted((where, line, full) for (line, full), where in found.items())


def _words(command: str) -> list[str]:
    """The first command of a line, without environment assignments, comments, pipes and redirections."""
    command = re.split(r" (?:#|\||&&|>>?|;) ", f"{command} ")[0]
    words = shlex.split(command)
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        words.pop(0)
    return words


def _is_placeholder(word: str) -> bool:
    return "..." in word or bool(re.fullmatch(r"\[?[A-Z][A-Z_]*\]?", word)) or word.startswith("[")


def _target(words: list[str]) -> tuple[str, list[str]] | None:
    """(module whose main takes the rest, the rest) for a command of ours; None for another program."""
    program, rest = Path(words[0]).name, words[1:]
    if program == "ropebench":
        return "ropebench.cli", rest
    if program == "accelerate":  # accelerate launch [its options] SCRIPT ARGS
        script = next((i for i, w in enumerate(rest) if w in SCRIPTS or w.startswith("-m")), None)
        if script is None:
            return None
        return SCRIPTS.get(rest[script], "ropebench.sweep_lib"), rest[script + 1 :]
    if program.startswith("python"):
        while rest and rest[0] in ("-I", "-S"):
            rest = rest[1:]
        if rest[:1] == ["-m"] and len(rest) > 1:
            if rest[1].startswith(NOT_OURS) or not rest[1].startswith("ropebench"):
                return None
            return rest[1], rest[2:]
        if rest and rest[0] in SCRIPTS:
            return SCRIPTS[rest[0]], rest[1:]
    return None


class Parsed(BaseException):
    """Raised by the first complete parse: the command line was accepted (BaseException: a main that turns
    every Exception into one error line cannot swallow it)."""


def _main_of(module: str):
    loaded = importlib.import_module(module)
    if not hasattr(loaded, "main"):
        loaded = importlib.import_module(f"{module}.__main__")
    return loaded.main


def _run(module: str, argv: list[str], capsys) -> tuple[int | str | None, str]:
    """(exit code or "parsed", what it printed) of `module`'s main on argv, stopped at its first parse."""
    try:
        code = _main_of(module)(argv)
    except Parsed:
        code = "parsed"
    except SystemExit as stop:
        code = stop.code
    return code, capsys.readouterr().out


def _subcommand(argv: list[str]) -> list[str]:
    """The words before the first flag or placeholder: the subcommand (`bench compute-floor`, `report
    table`)."""
    words = []
    for word in argv:
        if word.startswith("-") or _is_placeholder(word) or "/" in word or "." in word:
            break
        words.append(word)
    return [] if words[:1] == ["help"] else words


@pytest.mark.slow
def test_every_documented_command_parses(monkeypatch, capsys):
    original = argparse.ArgumentParser.parse_args

    def parse_only(self, args=None, namespace=None):
        original(self, args, namespace)  # a bad flag or value: its usage error, SystemExit(2)
        raise Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_only)
    monkeypatch.chdir(ROOT)
    checked, wrong = 0, []
    for where, command, full in documented_commands():
        words = _words(command)
        if words and Path(words[0]).name == "bash":
            script = next((w for w in words[1:] if w.endswith(".sh")), None)
            if script is None or not (ROOT / script).is_file():
                wrong.append(f"{where}: `{command}`: no script {script}")
            checked += 1
            continue
        target = _target(words) if words else None
        if target is None:
            continue
        module, argv = target
        checked += 1
        if _is_placeholder(module.rpartition(".")[2]):  # `python -m ropebench.benchmarks.probes.NAME`
            importlib.import_module(module.rpartition(".")[0])
            continue
        cut = next((i for i, w in enumerate(argv) if _is_placeholder(w)), len(argv))
        if full and cut == len(argv):
            code, _ = _run(module, argv, capsys)
            if code not in (0, None, "parsed"):
                wrong.append(f"{where}: `{command}` exits {code}")
            continue
        # running text or a placeholder: the subcommand exists and its help names every flag given
        code, shown = _run(module, [*_subcommand(argv[:cut]), "--help"], capsys)
        missing = [
            w.split("=")[0]
            for w in argv[:cut]
            if w.startswith("--") and w != "--help" and w.split("=")[0] not in shown
        ]
        if code not in (0, None) or missing:
            wrong.append(f"{where}: `{command}`: help exits {code}, flags not in it: {missing}")
    assert not wrong, "\n".join(wrong)
    assert checked >= 100  # about 120 of ours in the docs (bad-input.md aside): the search must not go blind
