"""A Python file as one page to read: its notes on the left, the code they explain on the right.

    python -m lesson.annotated [FILE] --out DIR    # DIR/compressive.html; FILE: compressive.py

A note is a block of full-line comments (blank lines between them allowed), or the module's
docstring: Markdown with $...$ and $$...$$ math typeset as MathML, beside the code after it up to
the next note. `# 3. Name -----` is a heading, linked from the numbered list before the first one;
a `name` of one of the file's defs or classes links to its code; a paragraph from **Speed:** or
**Departure:** on is set apart; `Figure: PATH.svg` (a caption after a comma) puts that SVG inline
below the def or class that holds the note's code. The page is one file (lesson/annotated.html
around the sections) asking for nothing over the network; each section an element with
data-lines="START-END" (FILE's lines it shows, 1-based, covering the file once, in order) holding
a data-note and a data-code element. It needs an optional extra, pinned:

    pip install -r requirements-annotated.txt
"""

import argparse
import ast
import html
import io
import re
import sys
import tokenize
from pathlib import Path
from typing import List, NamedTuple

from training.checks import UserError, exit_status, one_line
from training.files import write_atomically

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_FILE = ROOT / "compressive.py"
DEFAULT_OUT = ROOT / "docs"
TEMPLATE = Path(__file__).with_name("annotated.html")  # the page around the sections, its style
PAGE_NAME = "compressive.html"  # the name the README gives, whatever FILE is called
EXTRA = "pip install -r requirements-annotated.txt"
# `# 3. Transformer-XL relative attention ------`: a heading; a comment of dashes alone: a rule
HEADING = re.compile(r"^(\S.*?)\s*-{3,}$")
RULE = re.compile(r"^-{3,}$")
DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


class Section(NamedTuple):
    start: int  # the first line it shows, 1-based
    end: int  # the last, included
    note: str  # Markdown
    code: List[int]  # the lines of code it shows, 1-based, in order


# --------------------------------------------------------------------------------------------------
# The file as sections: which lines are notes, which are code


def source_lines(text: str) -> List[str]:
    """The lines as Python counts them (a line ends at \\n, \\r\\n or \\r), without their ends."""
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def note_lines(text: str, tree: ast.Module) -> dict:
    """{line: its Markdown} for every line that belongs to a note: the full-line comments, and the
    module docstring's lines (its first line holds the whole docstring, the others nothing).
    Lines inside strings are never comments, whatever they hold."""
    lines = source_lines(text)
    notes = {}
    for token in tokenize.generate_tokens(io.StringIO("\n".join(lines)).readline):
        row, column = token.start
        if token.type == tokenize.COMMENT and not lines[row - 1][:column].strip():
            notes[row] = comment_markdown(token.string)
    docstring = module_docstring(tree)
    if docstring:
        node = tree.body[0]
        notes.update({row: "" for row in range(node.lineno, node.end_lineno + 1)})
        notes[node.lineno] = docstring
    return notes


def module_docstring(tree: ast.Module) -> str:
    """The module's docstring as Markdown: a one-line first paragraph becomes the page's title."""
    docstring = ast.get_docstring(tree, clean=True)
    if not docstring:
        return ""
    first, _, rest = docstring.partition("\n\n")
    return f"# {first}\n\n{rest}" if "\n" not in first else docstring


def comment_markdown(comment: str) -> str:
    """One comment line as Markdown: `#` and one space off; a heading marked as one."""
    text = comment[2:] if comment.startswith("# ") else comment[1:]
    if RULE.match(text.strip()):
        return ""
    heading = HEADING.match(text)
    return f"## {heading[1]}" if heading and not text.startswith(" ") else text


def sections(text: str, tree: ast.Module) -> List[Section]:
    """The file cut into sections, each a note and the code after it up to the next note. Blank
    lines between two comment blocks join them into one note; lines before the first note are a
    section without one."""
    lines = source_lines(text)
    if lines and lines[-1] == "":  # the end of the last line
        lines.pop()
    notes = note_lines(text, tree)
    starts, last = [], None  # a section starts at a note whose last line before, not blank, is code
    for row in range(1, len(lines) + 1):
        kind = "note" if row in notes else "code" if lines[row - 1].strip() else last
        if row == 1 or kind == "note" != last:
            starts.append(row)
        last = kind
    found = []
    for start, end in zip(starts, starts[1:] + [len(lines) + 1]):
        code_from = max([start - 1] + [row for row in range(start, end) if row in notes]) + 1
        filled = [n for n in range(code_from, end) if lines[n - 1].strip()]
        code = list(range(filled[0], filled[-1] + 1)) if filled else []
        note = "\n".join(notes.get(row, "") for row in range(start, code_from))
        found.append(Section(start, end - 1, note.strip("\n"), code))
    return found


def read_source(path: Path):
    """The text and syntax tree of a Python file (parsed, never run), or a UserError."""
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path} is not Python source: it is not UTF-8 text") from None
    try:
        return text, ast.parse(text)
    except (SyntaxError, ValueError) as e:  # ValueError: null bytes
        where = f" (line {e.lineno})" if getattr(e, "lineno", None) else ""
        why = e.msg if isinstance(e, SyntaxError) else str(e)
        raise UserError(f"{path} is not Python source: {why}{where}") from None


# --------------------------------------------------------------------------------------------------
# The page: Markdown and math for the notes, pygments for the code


def dependencies() -> None:
    """One line saying how to install the optional extra, where a part of it is missing."""
    try:
        import latex2mathml.converter  # noqa: F401
        import markdown_it  # noqa: F401
        import mdit_py_plugins.dollarmath  # noqa: F401
        import pygments  # noqa: F401
    except ImportError as e:
        raise UserError(f"lesson.annotated needs {e.name}, of an optional extra: {EXTRA}") from None


def markdown_renderer():
    """Markdown to HTML: CommonMark without raw HTML or images (a note can ask for nothing), with
    $...$ and $$...$$ typeset as MathML."""
    from latex2mathml.converter import convert
    from markdown_it import MarkdownIt
    from mdit_py_plugins.dollarmath import dollarmath_plugin

    def math(latex: str, options: dict) -> str:
        display = "block" if options.get("display_mode") else "inline"
        try:
            return convert(latex.strip(), display=display)
        except Exception as e:  # latex2mathml raises its own errors for LaTeX it cannot read
            raise UserError(
                f"${latex.strip()}$ is not LaTeX that latex2mathml reads: {one_line(e)}"
            ) from None

    md = MarkdownIt("commonmark", {"html": False}).disable("image")
    md.normalizeLink = lambda url, normalize=md.normalizeLink: normalize(relative_to_the_page(url))
    return md.use(dollarmath_plugin, allow_space=False, allow_digits=False, renderer=math)


def highlighted_lines(text: str) -> List[str]:
    """Each line of the file as highlighted HTML (the file is lexed whole, so a docstring is a
    string from its first line to its last)."""
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import PythonLexer

    lexer = PythonLexer(stripnl=False, ensurenl=False)
    return highlight("\n".join(source_lines(text)), lexer, HtmlFormatter(nowrap=True)).split("\n")


def code_style(indents: set) -> str:
    """pygments' colours for the code cells (its token classes, scoped to them), and per indentation
    of a line shown, its wrapped part 4 columns past it (after the 6 of the line number)."""
    from pygments.formatters import HtmlFormatter

    style = HtmlFormatter(style="default").get_token_style_defs(".code")
    for n in sorted(indents):
        style.append(f".code .l.i{n} {{ padding-left: {n + 10}ch; text-indent: -{n + 10}ch; }}")
    return "\n".join(style)


def definitions(tree: ast.Module) -> dict:
    """{name: line} of the file's defs and classes, by qualified name (`Layer.forward`) and, where
    no other has it, by their own name (`forward` alone when only one def is so named)."""
    found, by_name = {}, {}

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, DEFS):
                line = first_line(child)
                found[prefix + child.name] = line
                by_name.setdefault(child.name, []).append(line)
                visit(child, f"{prefix}{child.name}.")

    visit(tree, "")
    found.update({name: lines[0] for name, lines in by_name.items() if len(lines) == 1})
    return found


def linked(note: str, targets: dict) -> str:
    """A note's HTML with each `name` of a def or class a link to the section that shows it."""

    def link(match):
        line = targets.get(html.unescape(match[1]))
        return f'<a href="#L{line}">{match[0]}</a>' if line else match[0]

    return re.sub(r"<code>([A-Za-z_][\w.]*)</code>", link, note)


# Inline math and the punctuation around it, kept on one line: a browser may break a line on either
# side of a <math>, which would leave ", W_v" or "." alone at the start of the next
KEPT_TOGETHER = re.compile(
    r"(\(?)(<span class=\"math inline\"><math .*?</math></span>)((?:[,.;:!?)\]]|'s|\u2019s)*)",
    re.S,
)
SET_APART = re.compile(r"<p>((?:(?!</p>).)*?)<strong>(Speed|Departure):</strong>(.*?)</p>", re.S)
HEADING_NUMBER = re.compile(r"<h2>(\d+)\. ")
FIGURE = re.compile(r"<p>Figure: ([\w./-]+\.svg),? ?(.*?)</p>\n?", re.S)
FIGURE_MARKER = re.compile(r"^\s*# Figure: ([\w./-]+\.svg)", re.M)  # in the source, as written


def kept_together(note: str) -> str:
    keep = lambda m: f'<span class="nowrap">{m[0]}</span>' if m[1] or m[3] else m[0]
    return KEPT_TOGETHER.sub(keep, note)


def set_apart(note: str) -> str:
    """A paragraph's words from **Speed:** or **Departure:** on, as a paragraph of that class."""

    def split(match):
        before, kind, rest = match[1].strip(), match[2], match[3]
        head = f"<p>{before}</p>\n" if before else ""
        return f'{head}<p class="{kind.lower()}"><strong>{kind}:</strong>{rest}</p>'

    return SET_APART.sub(split, note)


def relative_to_the_page(href: str) -> str:
    """A link relative to the file's folder, made relative to the page's (docs/)."""
    if re.match(r"[a-z][a-z0-9+.-]*:|#", href):
        return href
    return href[len("docs/") :] if href.startswith("docs/") else "../" + href


def contents_linked(note: str, numbers: set) -> str:
    """A note's first numbered list, each item i a link to the heading numbered i."""
    match = re.search(r'<ol(?: start="(\d+)")?>\n(.*?)</ol>', note, re.S)
    if not match:
        return note
    items = re.findall(r"<li>(.*?)</li>", match[2], re.S)
    first = int(match[1] or 1)
    if not {first + k for k in range(len(items))} <= numbers:
        return note
    linked_items = "".join(
        f'<li><a href="#section-{first + k}">{item}</a></li>\n' for k, item in enumerate(items)
    )
    return note[: match.start(2)] + linked_items + note[match.end(2) :]


def figure(path: str, caption: str, folder: Path) -> str:
    """The SVG at path (relative to folder) inline, with the caption when one is given (the SVGs
    drawn from the model carry their own); "" when there is no such file."""
    if not (folder / path).is_file():
        return ""
    try:
        svg = (folder / path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"the figure {path}: {one_line(e)}") from None
    svg = re.sub(r"^<\?xml[^>]*\?>\s*", "", svg)
    if not svg.lstrip().startswith("<svg"):
        raise UserError(f"the figure {path} is not an SVG")
    caption = f"<figcaption>{caption[:1].upper()}{caption[1:]}</figcaption>" if caption else ""
    return f'<figure class="figure" data-figure="{html.escape(path)}">{svg}{caption}</figure>'


def figure_ends(cut: List[Section], tree: ast.Module) -> List[int]:
    """Per section, the index of the section that its figures follow: the one that holds the end
    of the innermost def or class around the section's first line of code (the section itself
    when that line lies in none)."""
    spans = [
        (first_line(node), node.end_lineno) for node in ast.walk(tree) if isinstance(node, DEFS)
    ]
    ends = []
    for k, section in enumerate(cut):
        line = section.code[0] if section.code else section.start
        around = [span for span in spans if span[0] <= line <= span[1]]
        end = min(around, key=lambda span: span[1] - span[0])[1] if around else line
        ends.append(next(n for n in range(k, len(cut)) if cut[n].end >= end))
    return ends


def first_line(node) -> int:
    """A def's or class's first line: its first decorator's, if it has one."""
    return min([node.lineno] + [d.lineno for d in node.decorator_list])


def indent(line: str) -> int:
    """A line's indentation, its class (`i8`: eight spaces): how far its wrapped part goes on."""
    return len(line) - len(line.lstrip(" "))


def render(text: str, tree: ast.Module, title: str, folder: Path = DEFAULT_FILE.parent) -> str:
    """The page of a Python file's text; folder: the file's, where its links and figures are."""
    md = markdown_renderer()
    code = highlighted_lines(text)
    cut = sections(text, tree)
    starts = {n: s.start for s in cut for n in range(s.start, s.end + 1)}
    targets = {name: starts[line] for name, line in definitions(tree).items()}
    notes = []
    for section in cut:
        try:
            notes.append(linked(md.render(section.note), targets) if section.note else "")
        except UserError as e:
            raise UserError(
                f"{title}, the note of lines {section.start}-{section.end}: {e}"
            ) from None
    numbers = {int(n) for note in notes for n in HEADING_NUMBER.findall(note)}
    source = source_lines(text)
    headed = next((k for k, note in enumerate(notes) if "<h2>" in note), len(notes))
    parts, figures = [], [[] for _ in cut]  # figures[k]: those that go below section k
    for k, (section, note, below) in enumerate(zip(cut, notes, figure_ends(cut, tree))):
        note = contents_linked(note, numbers) if k < headed else note  # before any heading
        note = HEADING_NUMBER.sub(lambda m: f'<h2 id="section-{m[1]}">{m[1]}. ', note)
        note = kept_together(set_apart(note))
        figures[below] += [figure(path, caption, folder) for path, caption in FIGURE.findall(note)]
        note = FIGURE.sub("", note)
        lines = "".join(  # each line's end inside its span: a block of its own when it wraps
            f'<span class="l i{indent(source[n - 1])}" data-n="{n}">{code[n - 1]}{end}</span>'
            for n, end in zip(section.code, ["\n"] * (len(section.code) - 1) + [""])
        )
        parts.append(
            f'<section id="L{section.start}" data-lines="{section.start}-{section.end}">\n'
            f'<div class="note" data-note>{note}</div>\n'
            f'<div class="code" data-code><pre>{lines}</pre></div>\n'
            + "".join(f"{f}\n" for f in figures[k] if f)  # after the code it explains (below >= k)
            + "</section>"
        )
    style = code_style({indent(source[n - 1]) for section in cut for n in section.code})
    page = TEMPLATE.read_text(encoding="utf-8").replace("__STYLE__", style)
    page = page.replace("__TITLE__", html.escape(title))
    return page.replace("__SECTIONS__", "\n".join(parts))  # last: the code may say anything


# --------------------------------------------------------------------------------------------------
# The command


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m lesson.annotated", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("file", nargs="?", type=Path, default=DEFAULT_FILE, help="the file to lay out")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the page's folder")
    return p.parse_args(argv)


def annotate(args) -> None:
    dependencies()
    text, tree = read_source(args.file)
    if args.out.exists() and not args.out.is_dir():
        raise UserError(f"--out {args.out} is a file, not a folder")
    folder = args.file.resolve().parent
    page = render(text, tree, args.file.name, folder)
    for path in FIGURE_MARKER.findall(text):
        if not (folder / path).is_file():
            print(f"the figure {path} is not there: the page is made without it", file=sys.stderr)
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / PAGE_NAME  # whatever FILE is called: a copy makes the same page
        write_atomically(str(path), lambda f: f.write(page.encode("utf-8")))
    except OSError as e:
        raise UserError(f"--out {args.out}: {one_line(e)}") from None
    print(f"wrote {path}")


def main(argv=None) -> int:
    return exit_status(lambda: annotate(parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
