"""The documents name no stale command and no broken link: every `python -m module` and
`python script.py` that a README, docs/*.md or lesson/TEACHERS.md names runs with --help, and knows
every flag the document gives it; every relative link of those documents points to a file (and
heading) that exists. Commands run in this process, as `python -m` runs them (runpy), so torch is
imported once: together a few seconds."""

import argparse
import contextlib
import glob
import io
import os
import re
import runpy
import shlex
import sys

import pytest

ROOT = os.path.dirname(os.path.abspath(__file__))
# modules of other projects that a document may name (pip install, a venv): not this project's
OTHER_PROJECTS = {"pip", "venv", "pytest", "http.server", "ensurepip"}
# commands that read their arguments without argparse, so that --help is taken for a file name:
# the documents name them, and they wait for a parser of their own
NO_HELP_YET = {}
# files that a document links and that come with work not yet in this tree: a link to one is checked
# once it exists, and the file's arrival fails the test until it leaves this list
ARRIVING = {}
COMMAND = re.compile(
    r"\bpython3? +(?:-m +(?P<module>[\w.]+)|(?P<script>[\w./-]+\.py))"
    r"(?P<rest>(?:(?!\bpython3? ).)*)"  # up to the next command on the line
)


def documents() -> list:
    """The documents a reader follows, relative to the repository's top folder."""
    found = {"README.md", "lesson/TEACHERS.md"}
    found |= set(glob.glob("docs/*.md", root_dir=ROOT))
    found |= set(glob.glob("**/README.md", root_dir=ROOT, recursive=True))
    outside = ("out/", "/out/", "site-packages")  # run outputs, a virtual environment's packages
    return sorted(
        f for f in found if not f.startswith(outside) and not any(o in f for o in outside)
    )


def prose_and_code(text: str) -> str:
    """The document with its Python snippets left out (they are tested by running them), its
    inline code spans on one line and its shell lines continued with a backslash joined."""
    text = re.sub(r"^```python\n.*?^```$", "", text, flags=re.S | re.M)
    text = re.sub(r"`[^`\n]+(?:\n[^`\n]+)?`", lambda m: m.group(0).replace("\n", " "), text)
    return re.sub(r"\\\n\s*", " ", text)


def commands_in(text: str) -> list:
    """(module or script, its arguments as written) for every python command in text: a command
    ends with its code span, its line, a shell operator or a comment."""
    found = []
    for line in prose_and_code(text).splitlines():
        for match in COMMAND.finditer(line):
            rest = re.split(r"`|&&|\|\||[;|]| #", match["rest"])[0]
            try:
                words = shlex.split(rest)
            except ValueError:  # an unbalanced quote in prose: the words as they stand
                words = rest.split()
            found.append((match["module"] or match["script"], [w.strip("[]") for w in words]))
    return found


def all_commands() -> dict:
    """{(module or script, its subcommand or ""): {flag named: the documents naming it}}."""
    commands = {}
    for document in documents():
        with open(os.path.join(ROOT, document), encoding="utf-8") as f:
            text = f.read()
        for program, words in commands_in(text):
            if program.split(".")[0] in OTHER_PROJECTS:
                continue
            # a first word that is no flag may be a subcommand (research.study run), whose --help
            # shows its own flags; or a positional argument such as a file
            first = words[0] if words and re.fullmatch(r"[a-z][\w-]*", words[0]) else ""
            flags = {w.split("=")[0] for w in words if re.fullmatch(r"--[a-z][\w-]*(=.*)?", w)}
            entry = commands.setdefault((program, first), {})
            for flag in flags | {""}:  # "": the command itself
                entry.setdefault(flag, set()).add(document)
    return commands


def help_of(program: str, first: str, monkeypatch) -> tuple:
    """(exit status, what it printed) of `python program --help`, and where first is one of its
    subcommands ({run,table} in its usage), of `python program first --help` too."""
    status, printed = run_help(program, [], monkeypatch)
    if status == 0 and first and re.search(rf"{{[\w,-]*\b{first}\b[\w,-]*}}", printed):
        status, more = run_help(program, [first], monkeypatch)
        printed += more
    return status, printed


def run_help(program: str, words: list, monkeypatch) -> tuple:
    """(exit status, what it printed) of `python program *words --help`, run in-process."""
    path = os.path.join(ROOT, program)
    monkeypatch.setattr(
        sys, "argv", [path if program.endswith(".py") else program, *words, "--help"]
    )
    out, err = io.StringIO(), io.StringIO()
    status = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            if program.endswith(".py"):
                runpy.run_path(path, run_name="__main__")
            else:
                runpy.run_module(program, run_name="__main__", alter_sys=True)
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except Exception as e:  # a module that is gone, or fails before it reads its flags
            status, err = 1, io.StringIO(f"{type(e).__name__}: {e}")
    return status, out.getvalue() + err.getvalue()


def test_the_documents_name_commands_and_find_them():
    """What the test below relies on: commands found in code blocks, inline spans broken over two
    lines, continued lines, with comments, shell operators and other projects left out."""
    text = (
        "Run `python sample.py --chars 500 --prompt\n"
        '"ROMEO:"` or `python evaluate.py` on it:\n\n'
        "    OMP_NUM_THREADS=1 python train_shakespeare.py --steps 10 \\\n"
        "        --seed 1   # a comment --not-a-flag\n"
        "    pip install -r requirements.txt && python -m research.study run --budget long\n"
        "    python -m pip install ruff\n"
        "```python\nprint('python -m not.a.command')\n```\n"
    )
    assert commands_in(text) == [
        ("sample.py", ["--chars", "500", "--prompt", "ROMEO:"]),
        ("evaluate.py", []),
        ("train_shakespeare.py", ["--steps", "10", "--seed", "1"]),
        ("research.study", ["run", "--budget", "long"]),
        ("pip", ["install", "ruff"]),
    ]
    assert "README.md" in documents() and "lesson/TEACHERS.md" in documents()
    found = all_commands()
    assert (
        ("train_shakespeare.py", "") in found
        and ("research.study", "run") in found
        and len(found) >= 10
    )


@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")  # run as __main__
def test_every_command_the_documents_name_runs_with_help_and_knows_its_flags(monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(ROOT)
    stale, known = [], {}
    for (program, first), named_in in sorted(all_commands().items()):
        status, printed = help_of(program, first, monkeypatch)
        where = ", ".join(sorted(named_in[""]))
        command = " ".join(["python", *(["-m"] * (not program.endswith(".py"))), program])
        if status != 0 and program in NO_HELP_YET:
            known[program] = status
        elif status != 0:
            stale.append(f"{command} --help exits {status} ({where}): {printed.strip()[-300:]}")
        else:
            for flag in sorted(f for f in named_in if f):
                if not re.search(rf"(?<![\w-]){flag}(?![\w-])", printed):
                    where = ", ".join(sorted(named_in[flag]))
                    stale.append(f"{command} {first} has no {flag} ({where})".replace("  ", " "))
    assert stale == [], "\n".join(stale)
    # a command listed as lacking --help that has gained it leaves the list
    assert set(known) == set(NO_HELP_YET) & {program for program, _ in all_commands()}


@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")  # run as __main__
def test_every_flag_of_every_command_the_documents_name_says_what_it_does(monkeypatch):
    """Each flag that `--help` lists has a line on what it does (its subcommands' too)."""
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(ROOT)
    helped, bare = [], set()
    format_help = argparse.ArgumentParser.format_help

    def recorded(parser):
        helped.append(parser)
        return format_help(parser)

    monkeypatch.setattr(argparse.ArgumentParser, "format_help", recorded)
    for program, first in sorted(all_commands()):
        helped.clear()
        help_of(program, first, monkeypatch)
        assert helped, f"{program} --help printed no argparse help"
        for parser in helped:
            for action in parser._actions:
                if action.option_strings and not action.help:
                    bare.add(f"{parser.prog} {action.option_strings[-1]}")
    assert sorted(bare) == []


def test_a_gone_flag_and_a_gone_module_are_found(monkeypatch):
    """What the test above catches: a flag the command no longer has, a module that is gone."""
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(ROOT)
    status, printed = run_help("train_shakespeare.py", [], monkeypatch)
    assert status == 0 and "--steps" in printed and not re.search(r"--picture\b", printed)
    status, printed = run_help("training.no_such_command", [], monkeypatch)
    assert status == 1 and "No module named" in printed


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation out, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: str) -> set:
    with open(path, encoding="utf-8") as f:
        text = re.sub(r"^```.*?^```$", "", f.read(), flags=re.S | re.M)
    return {slug(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def test_every_relative_link_of_the_documents_points_to_what_exists():
    arrived = [
        f"{name} exists: take it out of ARRIVING"
        for name in ARRIVING
        if os.path.exists(os.path.join(ROOT, name))
    ]
    assert arrived == [], arrived
    broken = []
    for document in documents():
        with open(os.path.join(ROOT, document), encoding="utf-8") as f:
            text = re.sub(r"^```.*?^```$", "", f.read(), flags=re.S | re.M)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            path = os.path.normpath(os.path.join(ROOT, os.path.dirname(document), file or "."))
            path = path if file else os.path.join(ROOT, document)
            if os.path.relpath(path, ROOT) in ARRIVING:
                continue
            if file and not os.path.exists(path):
                broken.append(f"{document}: {target} (no such file)")
            elif anchor and path.endswith(".md") and anchor not in anchors(path):
                broken.append(f"{document}: {target} (no such heading)")
    assert broken == [], "\n".join(broken)
    assert slug("Real text: Python's own library") == "real-text-pythons-own-library"
    assert slug("Training on the answers (`--loss-on answers`)") == (
        "training-on-the-answers---loss-on-answers"
    )
