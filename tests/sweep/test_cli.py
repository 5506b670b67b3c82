"""The `ropebench` command (scripts/cli.py, installed as a console script): it lists its six subcommands,
each subcommand answers `--help` with the options of the CLI it hands over to, the old entry points still
answer with the same options, an unknown subcommand is one line and exit 2, and bad input below it keeps its
exit code. Run through the installed script in subprocesses, offline; nothing loads a model."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
ROPEBENCH = Path(PY).parent / "ropebench"  # the console script pip installs beside the interpreter
EXPECTED = ["sweep", "report", "inspect", "lm-eval", "bench", "export"]  # issue 23, item 2; issue 40

# ropebench's subcommand -> the old entry point that must do the same
OLD_ENTRY_POINTS = {
    ("sweep",): [PY, str(ROOT / "scripts" / "sweep.py")],
    ("report",): [PY, "-m", "ropebench.results", "report"],
    ("report", "table"): [PY, "-m", "ropebench.results", "table"],
    ("inspect",): [PY, "-m", "ropebench.extend", "inspect"],
    ("lm-eval",): [PY, "-m", "ropebench.integrations.lm_eval"],
    ("bench",): [PY, "-m", "ropebench.benchmarks"],
    ("bench", "run"): [PY, str(ROOT / "benchmarks" / "run.py")],
}


def run(cmd, cwd=ROOT):
    # COLUMNS: argparse wraps help to the terminal width; both sides of a comparison get the same one
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", COLUMNS="120")
    env.pop("PYTHONPATH", None)
    return subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def flags(help_text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*", help_text))


def test_the_console_script_is_installed():
    assert ROPEBENCH.is_file(), f"{ROPEBENCH} is missing: reinstall with `bash scripts/setup.sh`"


@pytest.mark.parametrize("argv", [["--help"], ["-h"], ["help"]], ids=["--help", "-h", "help"])
def test_help_lists_the_six_subcommands_one_line_each(argv):
    out = run([ROPEBENCH, *argv])
    assert out.returncode == 0, out.stderr
    listed = re.findall(r"^  (\S+)  +\S", out.stdout, flags=re.MULTILINE)
    assert listed == EXPECTED
    assert out.stderr == ""


def test_help_imports_none_of_the_subcommands_packages():
    code = (
        "import sys; from ropebench.cli import main; main(['--help']); "
        "print(sorted(m for m in ('torch', 'extend', 'results', 'benchmarks', 'ropebench.sweep_lib') "
        "if m in sys.modules))"
    )
    out = run([PY, "-c", code])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("sub", list(OLD_ENTRY_POINTS), ids=" ".join)
def test_each_subcommand_answers_help_with_the_options_of_its_old_entry_point(sub):
    new = run([ROPEBENCH, *sub, "--help"])
    assert new.returncode == 0, new.stderr[-2000:]
    assert "usage" in new.stdout.lower()
    old = run([*OLD_ENTRY_POINTS[sub], "--help"])
    assert old.returncode == 0, old.stderr[-2000:]
    assert flags(new.stdout) == flags(old.stdout)
    assert len(flags(new.stdout)) > 1  # more than --help itself: the subcommand's own options


def test_no_command_is_a_usage_error():
    """Issue 32 item 3: `ropebench` alone used to exit 0 with the command list; it is a usage error."""
    out = run([ROPEBENCH])
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no command given") and "lm-eval" in lines[0]


def test_help_command_shows_that_commands_help():
    """`ropebench help sweep` is `ropebench sweep --help`; `ropebench help nosuch` names the commands."""
    out = run([ROPEBENCH, "help", "sweep"])
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout == run([ROPEBENCH, "sweep", "--help"]).stdout and "--methods" in out.stdout
    out = run([ROPEBENCH, "help", "nosuch"])
    assert out.returncode == 2 and "unknown command 'nosuch'" in out.stderr


@pytest.mark.parametrize("name", ["swep", "table", "--version", "Sweep"])
def test_an_unknown_subcommand_is_one_line_and_exit_2(name):
    out = run([ROPEBENCH, name])
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and repr(name) in lines[0], out.stderr
    assert all(sub in lines[0] for sub in EXPECTED)  # says what the commands are
    assert out.stdout == ""


def test_a_close_misspelling_gets_the_nearest_subcommand():
    out = run([ROPEBENCH, "lm_eval"])
    assert out.returncode == 2 and "did you mean `ropebench lm-eval`" in out.stderr


def test_bad_input_below_a_subcommand_keeps_its_one_line_and_exit_2(tmp_path):
    """The subcommand's own error handling reaches the user unchanged: `report` on a missing directory."""
    missing = tmp_path / "no-such-run"
    out = run([ROPEBENCH, "report", missing])
    assert out.returncode == 2, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "no-such-run" in lines[0]
    assert not missing.exists()


def test_the_command_ignores_packages_in_the_working_directory(tmp_path):
    """A user's own `results/` or `extend/` in the working directory does not replace ropebench's (the console
    script does not put the working directory on sys.path, unlike `python -m`)."""
    for name in ("results", "extend", "tasks"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ImportError('the user own {name}')\n")
    out = run([ROPEBENCH, "report", "--help"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "RUN_DIR" in out.stdout


def test_an_out_name_that_is_not_utf8_is_refused_before_anything_is_written(tmp_path, capsys):
    """Issue 32 item 5: such a name used to be accepted, the records written, and the run to die with a
    UnicodeEncodeError traceback before the report."""
    import os

    from ropebench.sweep_lib.cli import main

    bad = os.fsdecode(bytes(tmp_path) + b"/run\xff")
    code = main(["--out", bad, "--methods", "plain", "--tasks", "perplexity", "--dry-run"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "not valid UTF-8" in err[0]
    assert os.listdir(tmp_path) == []


def test_help_names_no_path_of_the_checkout():
    """A wheel user has no scripts/ or benchmarks/ folder: the help of every command names what is installed
    (the shipped configs by name, `python -m` modules), never a checkout path."""
    checkout = re.compile(r"(?<![\w.])(scripts|benchmarks|extend|tasks|results|tests)/[\w./-]+")
    for sub in ([], *[[name] for name in EXPECTED]):
        text = run([PY, "-m", "ropebench", *sub, "--help"]).stdout
        assert text and not checkout.findall(text), (sub, checkout.findall(text))


def test_a_shipped_config_is_named_without_its_path(tmp_path):
    """--config takes a file or the name of a config shipped with ropebench (package data); a name that is
    neither is one line naming the shipped ones."""
    from ropebench.sweep_lib.config import ConfigError, config_path, read_yaml, shipped_configs

    assert {"demo", "demo-remap", "llama2-7b-gpu"} <= set(shipped_configs())
    assert read_yaml(config_path("llama2-7b-gpu"))["tasks"]
    mine = tmp_path / "demo"  # a file of that name wins over the shipped config
    mine.write_text("out: x\n")
    assert config_path(str(mine)) == mine
    with pytest.raises(ConfigError, match="name a shipped config: demo, demo-remap"):
        read_yaml(config_path("no-such-config"))
