"""The annotated page (lesson/annotated.py) as tests: compressive.py cut into sections that cover
it once, in order, each note beside the code it explains, every line of code shown, every def and
class with a note of its own, headings as headings, the aligned blocks kept, the math typeset;
then the page in a real browser (Debian's chromium driven by Playwright) at 1400 px: notes and code
side by side, the MathML laid out, no request, and a comment put into a copy of the source on the
page made from it. The command gives one error line for bad input, a missing extra included."""

import ast
import importlib.metadata
import io
import re
import shutil
import sys
import tokenize
from html.parser import HTMLParser
from pathlib import Path

import pytest

from conftest import error_line
from lesson import annotated, explore

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "compressive.py"
COMMITTED = ROOT / "docs" / "compressive.html"
MISSING_EXTRA = ""
try:
    annotated.dependencies()
except annotated.UserError as e:
    MISSING_EXTRA = str(e)
needs_extra = pytest.mark.skipif(bool(MISSING_EXTRA), reason=MISSING_EXTRA)
BROWSER_MISSING = explore.browser_missing()


def needs_browser(test):
    """A test that starts a real browser: among the slow tests (`pytest -m slow`), and skipped,
    saying why, where no browser or no extra is."""
    why = BROWSER_MISSING or MISSING_EXTRA
    reason = f"the page is tested in a real browser, and {why}"
    return pytest.mark.slow(pytest.mark.skipif(bool(why), reason=reason)(test))


VOID = {"br", "hr", "img", "input", "meta", "link", "wbr"}


class PageReader(HTMLParser):
    """A page's sections as the contract reads them: per element with data-lines, its data-note
    and data-code elements' text, and the tags inside the note."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.sections, self.inside, self.depth = [], None, 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section" and "data-lines" in attrs:
            start, end = map(int, attrs["data-lines"].split("-"))
            self.sections.append(dict(start=start, end=end, notes=0, codes=0, tags=[], text=""))
            self.sections[-1].update(note=[], code=[])
        elif self.inside:
            if self.inside == "note":
                self.sections[-1]["tags"].append(tag)
            self.depth += tag not in VOID
        elif self.sections and ("data-note" in attrs or "data-code" in attrs):
            self.inside = "note" if "data-note" in attrs else "code"
            self.sections[-1]["notes" if self.inside == "note" else "codes"] += 1
            self.depth = 1

    def handle_endtag(self, tag):
        if self.inside and tag not in VOID:
            self.depth -= 1
            self.inside = self.inside if self.depth else None

    def handle_data(self, data):
        if self.inside:
            self.sections[-1][self.inside].append(data)


def read_page(page: str):
    reader = PageReader()
    reader.feed(page)
    for section in reader.sections:
        section["note"] = "".join(section["note"])
        section["code"] = "".join(section["code"]).split("\n") if section["code"] else []
    return reader.sections


def code_lines(text: str):
    """The lines a reader must find in the code cells: every non-blank line that is neither a
    full-line comment nor part of the module's docstring (other docstrings are code)."""
    lines = text.split("\n")
    comments = {
        t.start[0]
        for t in tokenize.generate_tokens(io.StringIO(text).readline)
        if t.type == tokenize.COMMENT and not lines[t.start[0] - 1][: t.start[1]].strip()
    }
    docstring = ast.parse(text).body[0]
    module_doc = set(range(docstring.lineno, docstring.end_lineno + 1))
    return [
        line
        for n, line in enumerate(lines, 1)
        if line.strip() and n not in comments and n not in module_doc
    ]


@pytest.fixture(scope="module")
def page():
    text = SOURCE.read_text(encoding="utf-8")
    return annotated.render(text, ast.parse(text), "compressive.py")


@needs_extra
def test_the_sections_cover_the_file_once_and_show_every_line_of_code_in_order(page):
    text = SOURCE.read_text(encoding="utf-8")
    sections = read_page(page)
    assert len(sections) > 40
    assert [s["start"] for s in sections] == [1] + [s["end"] + 1 for s in sections[:-1]]
    assert sections[-1]["end"] == len(text.rstrip("\n").split("\n"))
    assert all(s["notes"] == 1 and s["codes"] == 1 for s in sections)
    shown = [line for s in sections for line in s["code"] if line.strip()]
    assert shown == code_lines(text)  # every line of code, each once, in order, as written
    for s in sections:  # a section shows its own lines
        lines = text.split("\n")[s["start"] - 1 : s["end"]]
        assert all(line in lines for line in s["code"])


@needs_extra
def test_every_def_and_class_has_a_note_of_its_own_right_above_it(page):
    sections = read_page(page)
    text = SOURCE.read_text(encoding="utf-8")
    tree = ast.parse(text)
    definitions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    assert len(definitions) > 50
    for node in definitions:
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        (section,) = [s for s in sections if s["start"] <= first <= s["end"]]
        assert section["note"].strip(), f"{node.name} (line {first}) has no note"
        assert section["code"][0].strip().startswith(("def ", "class ", "@")), node.name
        assert section["code"][0] == text.split("\n")[first - 1], node.name


@needs_extra
def test_headings_are_headings_and_the_four_term_block_keeps_its_layout(page):
    headings = re.findall(r"<h2>(.*?)</h2>", page)
    assert [h.split(" ")[0] for h in headings] == [f"{n}." for n in range(1, 9)]
    assert headings[2] == "3. Transformer-XL relative attention"
    assert "<li>Transformer-XL relative attention</li>" not in page
    # the (a)-(d) block: a preformatted block in the note, each line as the source aligns it
    block = re.search(r"<pre><code>(A_ij = .*?)</code></pre>", page, re.S)[1]
    source = SOURCE.read_text()
    four_lines = source[source.index("#     A_ij =") :].split("\n")[:4]
    assert block.rstrip("\n").split("\n") == [line[len("#     ") :] for line in four_lines]


@needs_extra
def test_the_math_is_typeset_and_the_page_asks_for_nothing(page):
    sections = read_page(page)
    math = [tag for s in sections for tag in s["tags"] if tag == "math"]
    assert len(math) > 100 and "mfrac" in {t for s in sections for t in s["tags"]}
    assert page.count('display="block"') >= 4  # the attention's two, Algorithm 2's, ...
    for s in sections:  # no $ is left in a note's text outside code
        prose = re.sub(r"<code>.*?</code>", "", s["note"], flags=re.S)
        assert "$" not in prose, s["start"]
    assert "default-src 'none'" in page
    assert not re.search(r"<(script|link|img|iframe|object)\b|\bsrc=|url\(|@import", page)


def test_a_docstring_with_hashes_and_dollars_stays_code_and_blank_lines_join_notes():
    text = '''"""A module.

Its docstring is the first note."""

import os

# 1. A heading ----------
# with $x_1$ math

# and a second block after a blank line
def f():
    """# not a comment, $not math$
    # nor this"""
    x = 1  # trailing: code
    # a note inside the body
    return x
'''
    sections = annotated.sections(text, ast.parse(text))
    assert [(s.start, s.end) for s in sections] == [(1, 6), (7, 14), (15, 16)]
    assert sections[0].note.startswith("# A module.\n\nIts docstring") and sections[0].code == [5]
    assert sections[1].note == (
        "## 1. A heading\nwith $x_1$ math\n\nand a second block after a blank line"
    )
    assert sections[1].code == [11, 12, 13, 14]  # the docstring's lines and the trailing comment
    assert sections[2].note == "a note inside the body" and sections[2].code == [16]


def run(capsys, *argv):
    status = annotated.main([str(a) for a in argv])
    return status, capsys.readouterr()


@needs_extra
def test_the_command_writes_compressive_html_into_the_folder(tmp_path, capsys):
    source = tmp_path / "tiny.py"
    source.write_text("# A note with $a^2$.\nx = 1\n")
    status, out = run(capsys, source, "--out", tmp_path / "new" / "folder")
    assert status == 0 and "compressive.html" in out.out
    page = (tmp_path / "new" / "folder" / "compressive.html").read_text()
    assert 'data-lines="1-2"' in page and "<msup>" in page and "<title>tiny.py</title>" in page


@needs_extra
@pytest.mark.parametrize(
    "content, why",
    [
        (None, "no such file"),
        (b"\xff\xfe", "not UTF-8"),
        (b"def (:\n", "is not Python source"),
        (b"# $\\left( x$\nx = 1\n", "is not LaTeX that latex2mathml reads"),
    ],
)
def test_bad_input_gives_one_error_line(tmp_path, capsys, content, why):
    source = tmp_path / "bad.py"
    if content is not None:
        source.write_bytes(content)
    status = annotated.main([str(source), "--out", str(tmp_path)])
    assert status == 2 and why in error_line(capsys)
    assert not (tmp_path / "compressive.html").exists()


@needs_extra
def test_an_out_that_is_a_file_gives_one_error_line(tmp_path, capsys):
    (tmp_path / "taken").write_text("")
    assert annotated.main([str(SOURCE), "--out", str(tmp_path / "taken")]) == 2
    assert "is a file, not a folder" in error_line(capsys)


def test_a_missing_extra_gives_one_error_line_naming_the_package(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "latex2mathml", None)  # import latex2mathml fails
    monkeypatch.setitem(sys.modules, "latex2mathml.converter", None)
    assert annotated.main([str(SOURCE), "--out", str(tmp_path)]) == 2
    line = error_line(capsys)
    assert "latex2mathml" in line and "pip install -r requirements-annotated.txt" in line
    assert not list(tmp_path.iterdir())


def pinned_versions():
    """{package: version} of requirements-annotated.txt."""
    lines = (ROOT / "requirements-annotated.txt").read_text().splitlines()
    return dict(line.split("==") for line in lines if line and not line.startswith("#"))


def installed_versions():
    return {name: importlib.metadata.version(name) for name in pinned_versions()}


@needs_extra
@pytest.mark.skipif(
    not MISSING_EXTRA and installed_versions() != pinned_versions(),
    reason="the page is compared where the extra's pinned versions are installed (CI's)",
)
def test_the_committed_page_is_what_the_command_makes_today(page):
    assert COMMITTED.read_text(encoding="utf-8") == page, (
        "docs/compressive.html is not the page of today's compressive.py: run "
        "`python -m lesson.annotated` and commit docs/compressive.html"
    )


# ---------------------------------------------------------------- in a real browser -------------


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = explore.open_browser(playwright)
        yield browser
        browser.close()


def opened(browser, path: Path):
    """The page at path, opened from the disk at 1400 x 1000 px, every request but for the page
    itself refused and recorded. Returns (page, the addresses asked for)."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    asked = []

    def only_the_page(route):
        if route.request.url == path.as_uri():
            route.continue_()
        else:
            asked.append(route.request.url)
            route.abort()

    page.route("**/*", only_the_page)
    page.on("request", lambda r: r.url != path.as_uri() and asked.append(r.url))
    page.goto(path.as_uri())
    return page, asked


LAYOUT = """() => [...document.querySelectorAll('[data-lines]')].map(s => {
    const note = s.querySelector('[data-note]').getBoundingClientRect();
    const code = s.querySelector('[data-code]').getBoundingClientRect();
    return [s.dataset.lines, note.left, note.right, note.top, code.left, code.right, code.top];
})"""

# Each fraction's numerator above its denominator, each subscript below its base's middle: the
# MathML is laid out as math, not run together as text
MATH_LAYOUT = """() => {
    const maths = [...document.querySelectorAll('math')];
    const fractions = [...document.querySelectorAll('mfrac')].map(f => {
        const [num, den] = [...f.children].map(c => c.getBoundingClientRect());
        return num.bottom <= den.top + 1 && num.height > 0 && den.height > 0;
    });
    const subscripts = [...document.querySelectorAll('msub')].map(s => {
        const [base, sub] = [...s.children].map(c => c.getBoundingClientRect());
        return sub.bottom > base.bottom + 1 && sub.left > base.left;
    });
    const sized = maths.filter(m => m.getBoundingClientRect().width > 0).length;
    return [maths.length, sized, fractions, subscripts];
}"""


@needs_browser
def test_the_page_lays_notes_beside_code_and_typesets_the_math_asking_for_nothing(
    tmp_path, browser, capsys
):
    assert annotated.main([str(SOURCE), "--out", str(tmp_path)]) == 0
    page, asked = opened(browser, tmp_path / "compressive.html")
    rows = page.evaluate(LAYOUT)
    assert len(rows) > 40
    for lines, note_left, note_right, note_top, code_left, code_right, code_top in rows:
        assert note_right <= code_left + 1, lines  # the note left of the code
        assert abs(note_top - code_top) < 1, lines  # their tops aligned
        assert note_right - note_left > 400 and code_right - code_left > 700, lines
    n_math, sized, fractions, subscripts = page.evaluate(MATH_LAYOUT)
    assert n_math > 100 and sized == n_math
    assert len(fractions) >= 1 and all(fractions)  # the attention score's
    assert len(subscripts) > 50 and all(subscripts)
    assert asked == []
    page.close()


@needs_browser
def test_a_comment_put_into_a_copy_of_the_source_shows_on_the_page_made_from_it(
    tmp_path, browser, capsys
):
    copy = tmp_path / "copy.py"
    text = SOURCE.read_text(encoding="utf-8")
    note = "# A note put in by a test: $x_{42}^2$ beside relative_shift.\n"
    copy.write_text(text.replace("\ndef relative_shift(", f"\n{note}def relative_shift("))
    assert annotated.main([str(copy), "--out", str(tmp_path)]) == 0
    page, asked = opened(browser, tmp_path / "compressive.html")
    found = page.evaluate(
        """() => [...document.querySelectorAll('[data-lines]')]
            .filter(s => s.querySelector('[data-note]').innerText.includes('put in by a test'))
            .map(s => [s.querySelector('[data-code]').innerText.split('\\n')[0],
                       s.querySelectorAll('[data-note] msubsup').length])"""
    )
    assert found == [["def relative_shift(position_scores: torch.Tensor) -> torch.Tensor:", 1]]
    assert asked == []
    page.close()


@needs_browser
def test_the_committed_page_opens_from_the_disk_asking_for_nothing(tmp_path, browser):
    shutil.copy(COMMITTED, tmp_path / "compressive.html")
    page, asked = opened(browser, tmp_path / "compressive.html")
    assert page.evaluate("document.querySelectorAll('[data-lines]').length") > 40
    assert asked == []
    page.close()
