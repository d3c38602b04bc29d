"""The annotated page (lesson/annotated.py) as tests: compressive.py cut into sections that cover
it once, in order, each note beside the code it explains, every line of code shown, code without a
note of its own beside the note above it (every def and class beside a note, no docstring saying
again what its note says), headings as headings, the four-term score typeset one term a line, the
math typeset, Speed and Departure notes set apart (every note on speed marked as one), the
contents linked, each figure inline below the whole def it explains with one caption (a figure not
made yet left out, the page still made) and the worked trace the model's own; then the page in a
real browser (Debian's chromium driven by Playwright) at 1024, 1280 and 1400 px: notes and code
side by side, the MathML laid out, no note cut off or scrolling, no code cell scrolling (a long
line wraps, its continuation indented past the line's own indentation), the four-term score whole,
the contents' links landing on their sections, the Speed notes hidden and shown again on request,
no request, and a comment put into a copy of the source on the page made from it. The command gives
one error line for bad input, a missing extra included."""

import ast
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


def first_line(node) -> int:
    return min([node.lineno] + [d.lineno for d in node.decorator_list])


@needs_extra
def test_only_a_note_starts_a_section_so_every_def_lies_beside_a_note(page):
    sections = read_page(page)
    text = SOURCE.read_text(encoding="utf-8")
    tree = ast.parse(text)
    assert all(s["note"].strip() for s in sections)  # code without a note joins the one above
    lines = text.split("\n")
    for s in sections[1:]:  # each section opens on a comment line
        assert lines[s["start"] - 1].lstrip().startswith("#"), s["start"]
    top = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    assert len(top) > 20
    for node in top:  # every top-level def and class opens the section of a note of its own
        (section,) = [s for s in sections if s["start"] <= first_line(node) <= s["end"]]
        assert section["code"][0] == lines[first_line(node) - 1], node.name


def words(text: str):
    return re.findall(r"[a-z0-9]+", text.lower())


def docstrings_that_repeat_their_note(text: str):
    """The defs and classes whose docstring's first sentence is mostly in the note beside them:
    [(name, the share of its runs of six words found there)]."""
    tree = ast.parse(text)
    cut = annotated.sections(text, tree)
    found = []
    for node in ast.walk(tree):
        doc = isinstance(node, (ast.FunctionDef, ast.ClassDef)) and ast.get_docstring(node)
        if not doc:
            continue
        (section,) = [s for s in cut if s.start <= first_line(node) <= s.end]
        sentence, note = words(doc.split(". ")[0]), " ".join(words(section.note))
        runs = [" ".join(sentence[k : k + 6]) for k in range(max(1, len(sentence) - 5))]
        share = sum(run in note for run in runs) / len(runs)
        if share >= 0.2:
            found.append((node.name, round(share, 2)))
    return found


def test_no_docstring_says_again_what_its_note_says():
    assert docstrings_that_repeat_their_note(SOURCE.read_text(encoding="utf-8")) == []
    # the pairs that said one thing twice, caught
    pair = (
        "# The paper's best $f_c$: a 1-D convolution with kernel = stride = $c$.\n"
        "class ConvCompress:\n"
        '    """The paper\'s best f_c: a 1-D convolution with kernel = stride = c."""\n'
    )
    assert docstrings_that_repeat_their_note(pair) == [("ConvCompress", 1.0)]


@needs_extra
def test_headings_are_headings_linked_from_the_contents_and_the_score_is_typeset(page):
    headings = re.findall(r'<h2 id="section-(\d+)">(.*?)</h2>', page)
    assert [(int(n), h.split(" ")[0]) for n, h in headings] == [(n, f"{n}.") for n in range(1, 9)]
    assert headings[2][1] == "3. Transformer-XL relative attention"
    contents = re.findall(r'<li><a href="#section-(\d+)">', page)
    assert contents == [str(n) for n in range(1, 9)]
    # the four-term score: one row a term, each with its label
    table = next(
        t for t in re.findall(r"<mtable.*?</mtable>", page, re.S) if "content&#x000A0;bias" in t
    )
    rows = re.findall(r"<mtr>(.*?)</mtr>", table, re.S)
    labels = [
        re.findall(r"<mtext>(.*?)</mtext>", row)[-1].replace("&#x000A0;", " ") for row in rows
    ]
    assert labels == ["(a) content", "(b) position", "(c) content bias", "(d) position bias"]


@needs_extra
def test_the_math_is_typeset_and_the_page_asks_for_nothing(page):
    sections = read_page(page)
    math = [tag for s in sections for tag in s["tags"] if tag == "math"]
    assert len(math) > 100 and "mfrac" in {t for s in sections for t in s["tags"]}
    assert page.count('display="block"') >= 10  # the score, the shift, Algorithm 2, the reach...
    big = [m for m in re.findall(r"<math .*?</math>", page, re.S) if m.count("<") // 2 >= 25]
    assert len(big) >= 8
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


@needs_extra
def test_speed_and_departure_are_set_apart_links_move_to_docs_and_a_figure_goes_inline(tmp_path):
    (tmp_path / "fig.svg").write_text('<?xml version="1.0"?>\n<svg width="10"><rect/></svg>\n')
    text = (
        "# Why $x_1$, then $y$. **Speed:** one matmul.\n"
        "#\n"
        "# **Departure:** none; see [the tests](test_x.py), [a doc](docs/y.md), [c](https://a.b).\n"
        "#\n"
        "# Figure: fig.svg, a caption.\n"
        "x = 1\n"
    )
    page = annotated.render(text, ast.parse(text), "t.py", tmp_path)
    assert '<p class="speed"><strong>Speed:</strong> one matmul.</p>' in page
    assert '<p class="departure"><strong>Departure:</strong> none;' in page
    inline = r'<span class="math inline"><math .*?</math></span>'
    assert re.search(rf'<span class="nowrap">{inline},</span>', page)  # "$x_1$," on one line
    assert re.search(rf'<span class="nowrap">{inline}\.</span>', page)
    hrefs = re.findall(r'href="([^"]*)"', page)
    assert hrefs == ["../test_x.py", "y.md", "https://a.b"]
    assert '<figure class="figure" data-figure="fig.svg"><svg width="10"><rect/></svg>' in page
    assert "<figcaption>A caption.</figcaption>" in page and "Figure:" not in page
    (tmp_path / "fig.svg").write_text("<html>not one</html>")
    with pytest.raises(annotated.UserError, match="the figure fig.svg is not an SVG"):
        annotated.render(text, ast.parse(text), "t.py", tmp_path)


FIGURED = """# A note above a function whose body holds a note of its own.
#
# Figure: a.svg
def f(x):
    y = x + 1
    # a note inside f: its code is a second section
    return y


# A note outside any def, its figure below its own code.
#
# Figure: b.svg, a caption of the page's own.
TABLE = [1, 2]


# The next function.
def g():
    return 0
"""


@needs_extra
def test_a_figure_goes_below_the_whole_def_its_note_explains_with_one_caption(tmp_path, capsys):
    for name in ("a.svg", "b.svg"):
        (tmp_path / name).write_text(f'<svg width="10"><text>{name}: its own caption</text></svg>')
    page = annotated.render(FIGURED, ast.parse(FIGURED), "t.py", tmp_path)
    sections = re.findall(r'<section id="L\d+" data-lines="(\d+-\d+)">(.*?)</section>', page, re.S)
    placed = [(lines, re.findall(r'data-figure="(\w\.svg)"', body)) for lines, body in sections]
    # f's code runs over two sections (the note inside it starts the second): its figure goes
    # below the second, never between the two halves of f
    assert placed == [("1-5", []), ("6-9", ["a.svg"]), ("10-15", ["b.svg"]), ("16-18", [])]
    assert page.count("<figure ") == 2
    assert page.count("<figcaption>") == 1  # a's SVG has its own; b's marker gives the caption
    assert "<figcaption>A caption of the page's own.</figcaption>" in page
    (tmp_path / "a.svg").unlink()  # a figure not made yet: the page is made without it
    page = annotated.render(FIGURED, ast.parse(FIGURED), "t.py", tmp_path)
    assert re.findall(r'data-figure="(\w\.svg)"', page) == ["b.svg"] and "Figure:" not in page
    source = tmp_path / "t.py"
    source.write_text(FIGURED)
    assert annotated.main([str(source), "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert err == "the figure a.svg is not there: the page is made without it\n"
    assert (tmp_path / "out" / "compressive.html").exists()


# The figures compressive.py's notes name, each with the def it explains: the figure goes below it
FIGURES = {
    "docs/shift.svg": "relative_shift",
    "docs/recon.svg": "attention_reconstruction_loss",
    "docs/fifo.svg": "CompressiveLayer.update_memory",
    "docs/mask.svg": "CompressiveTransformer.hidden_states",
    "docs/reach.svg": "reach",
}


@needs_extra
def test_each_figure_of_compressive_py_goes_below_the_code_it_explains(tmp_path):
    """With every figure there (stand-ins here: the real ones are drawn from the model), each
    lies after the last line of its def, in the order of the file, and none inside a def."""
    text = SOURCE.read_text(encoding="utf-8")
    tree = ast.parse(text)
    assert annotated.FIGURE_MARKER.findall(text) == list(FIGURES)
    (tmp_path / "docs").mkdir()
    for path in FIGURES:
        (tmp_path / path).write_text(f'<svg width="1002"><text>{path}</text></svg>')
    page = annotated.render(text, tree, "compressive.py", tmp_path)
    ends = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.ClassDef)):
                parent = node.name + "." if isinstance(node, ast.ClassDef) else ""
                ends[parent + child.name] = child.end_lineno
    found = []
    for section in re.findall(r"<section .*?</section>", page, re.S):
        last_line = int(re.findall(r'data-n="(\d+)"', section)[-1])
        for path in re.findall(r'data-figure="([\w./]+)"', section):
            found.append((path, last_line))
            assert section.index(f'data-figure="{path}"') > section.index("</pre>")
    assert found == [(path, ends[name]) for path, name in FIGURES.items()]


@needs_extra
def test_the_papers_enwik8_numbers_are_lists_beside_the_choice_of_f_c_and_of_its_loss(page):
    sections = [s for s in read_page(page) if "0.973" in s["note"]]
    firsts = [s["code"][0].split("(")[0] for s in sections]
    assert firsts == ["class ConvCompress", "def autoencoding_loss"]
    notes = re.findall(r'<div class="note" data-note>(.*?)</div>', page, re.S)
    for note in filter(lambda note: "0.973" in note, notes):
        items = re.findall(r"<li>(.*?)</li>", note, re.S)
        scores = [
            re.findall(r"0\.9\d\d", item)[-1] for item in items if re.search(r"0\.9\d\d", item)
        ]
        assert scores[0] == "0.973" and scores[-1] == "0.996" and scores == sorted(scores)
        assert "0.984" in scores  # the auto-encoding loss's row, in both


def test_the_worked_trace_beside_update_memory_is_what_a_model_holds():
    """The table of FIFO lengths in update_memory's note, against a real model's memory tensors
    read back as positions (lesson.mechanism, which also checks them against the rule)."""
    from lesson import mechanism

    source = SOURCE.read_text(encoding="utf-8")
    sizes = re.search(
        r"\$n_s = (\d+)\$, \$n_m = (\d+)\$, \$n_\{cm\} = (\d+)\$, \$c = (\d+)\$", source
    )
    table = source[source.index("\\text{call}") : source.index("\\end{array}", sizes.end())]
    rows = {}
    for line in filter(lambda line: "&" in line, table.split("\n")):
        cells = [c.strip() for c in line.lstrip("# ").rstrip("\\ ").split("&")]
        rows[cells[0].removeprefix("\\text{").removesuffix("}")] = [int(c) for c in cells[1:]]
    n_s, n_m, n_cm, c = map(int, sizes.groups())
    steps = mechanism.model_fifo_steps(n_s, n_m, n_cm, c, len(rows["call"]))
    assert rows == {
        "call": list(range(1, len(steps) + 1)),
        "mem": [len(s.mem) for s in steps],
        "evicted": [len(s.evicted) for s in steps],
        "compressed": [len(s.compressed) for s in steps],
        "fell off c_mem": [len(s.dropped) for s in steps],
        "c_mem": [len(s.c_mem) for s in steps],
    }


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


# At a width: notes or formulas that scroll or stick out of their note, the code cells that
# scroll, the formulas of 25 elements or more, the page's own width, the FIFO figure's width
FIT = """() => {
    const over = e => e.scrollWidth > e.clientWidth + 1;
    const where = e => e.closest('[data-lines]').dataset.lines;
    const notes = [...document.querySelectorAll('[data-note]')];
    const cut = [...document.querySelectorAll('[data-note] math, [data-note] pre')].filter(m => {
        const r = m.getBoundingClientRect(), n = m.closest('[data-note]').getBoundingClientRect();
        return r.right > n.right + 1 || over(m); }).map(where);
    const codes = [...document.querySelectorAll('[data-code] pre')];
    const big = [...document.querySelectorAll('math[display=block]')].filter(
        m => m.querySelectorAll('*').length >= 25).length;
    const fifo = document.querySelector('[data-figure="docs/fifo.svg"] svg');
    const figure = fifo.getBoundingClientRect().width;
    const fits = e => e.scrollWidth <= e.clientWidth;
    const score = [...document.querySelectorAll('math[display=block]')].filter(
        m => /content.bias/.test(m.textContent)).map(
        m => [m.querySelectorAll('mtr').length, fits(m) && fits(m.parentElement)]);
    return [notes.filter(over).map(where), cut, codes.filter(over).length, codes.length, big,
            document.documentElement.scrollWidth, figure, score];
}"""


# Punctuation that starts a line of a note (", W_v" after a formula): text that opens with it,
# its first character at its paragraph's left edge
ORPHANS = r"""() => {
    const found = [];
    for (const note of document.querySelectorAll('[data-note]')) {
        const walker = document.createTreeWalker(note, NodeFilter.SHOW_TEXT);
        for (let n = walker.nextNode(); n; n = walker.nextNode()) {
            if (!/^[,.;:)]/.test(n.textContent) || n.parentElement.closest('math, pre')) continue;
            const range = document.createRange();
            range.setStart(n, 0);
            range.setEnd(n, 1);
            const block = n.parentElement.closest('p, li') || note;
            const left = block.getBoundingClientRect().left
                + parseFloat(getComputedStyle(block).paddingLeft);
            const at = range.getBoundingClientRect();
            if (at.width && Math.abs(at.left - left) < 3) found.push(n.textContent.slice(0, 20));
        }
    }
    return found;
}"""


# Each line of code that wraps: its number, and whether every continuation starts right of the
# line's own first character (so a wrapped line never reads as dedented Python)
WRAPS = r"""() => {
    const found = [];
    for (const line of document.querySelectorAll('[data-code] .l')) {
        const range = document.createRange();
        range.selectNodeContents(line);
        const rects = [...range.getClientRects()].filter(r => r.width > 0);
        const later = rects.filter(r => r.top > rects[0].top + 2);
        if (!later.length) continue;
        const walker = document.createTreeWalker(line, NodeFilter.SHOW_TEXT);
        let start = null;
        for (let n = walker.nextNode(); n && start === null; n = walker.nextNode()) {
            const k = n.textContent.search(/\S/);
            if (k < 0) continue;
            const first = document.createRange();
            first.setStart(n, k);
            first.setEnd(n, k + 1);
            start = first.getBoundingClientRect().left;
        }
        found.push([Number(line.dataset.n), Math.min(...later.map(r => r.left)) > start + 1]);
    }
    return found;
}"""

# What the Speed notes say, found nowhere else: hiding them hides every one
SPEED_PHRASES = (
    "float32 bias would promote",
    "cast to float32 and back",
    "read fastest",
    "costs more forwards",
)


@needs_extra
def test_every_note_on_speed_is_marked_as_one(page):
    paragraphs = re.findall(r"<p( class=\"\w+\")?>(.*?)</p>", page, re.S)
    for phrase in SPEED_PHRASES:
        where = [kind for kind, text in paragraphs if phrase in re.sub(r"\s+", " ", text)]
        assert where and set(where) == {' class="speed"'}, phrase


@needs_browser
def test_a_wrapped_line_of_code_keeps_its_indentation(tmp_path, browser):
    assert annotated.main([str(SOURCE), "--out", str(tmp_path)]) == 0
    page, asked = opened(browser, tmp_path / "compressive.html")
    page.set_viewport_size({"width": 1024, "height": 900})
    wraps = page.evaluate(WRAPS)
    assert len(wraps) >= 20  # at 1024 px many lines wrap ...
    assert [n for n, indented in wraps if not indented] == []  # ... each under itself, indented
    page.close()


@needs_browser
@pytest.mark.parametrize("width", [1024, 1280, 1400])
def test_the_page_fits_a_laptop_and_hides_the_speed_notes_on_request(tmp_path, browser, width):
    assert annotated.main([str(SOURCE), "--out", str(tmp_path)]) == 0
    page, asked = opened(browser, tmp_path / "compressive.html")
    page.set_viewport_size({"width": width, "height": 900})
    measured = page.evaluate(FIT)
    scrolling_notes, cut, scrolling_code, n_code, big, page_width, figure, score = measured
    assert scrolling_notes == [] and cut == [] and page_width <= width
    assert scrolling_code <= 0.1 * n_code  # a long line wraps under itself instead
    assert big >= 8 and figure > 0.9 * min(width - 48, 1002)
    assert score == [[4, True]]  # the four-term score, a row a term, not cut off
    assert page.evaluate(ORPHANS) == []
    assert page.evaluate("document.querySelectorAll('[data-figure] figcaption').length") == 0
    shown = "() => [...document.querySelectorAll('.speed')].filter(e => e.offsetParent).length"
    assert page.evaluate(shown) >= 5
    page.click("label[for=hide-speed]")
    assert page.evaluate(shown) == 0
    visible = page.evaluate(
        "[...document.querySelectorAll('[data-note]')].map(n => n.innerText).join(' ')"
    )
    assert [p for p in SPEED_PHRASES if p in re.sub(r"\s+", " ", visible)] == []
    assert page.evaluate("document.querySelectorAll('.departure')[0].offsetParent !== null")
    page.click("label[for=hide-speed]")
    assert page.evaluate(shown) >= 5
    assert asked == []
    page.close()


@needs_browser
def test_the_contents_take_the_reader_to_each_section(tmp_path, browser):
    assert annotated.main([str(SOURCE), "--out", str(tmp_path)]) == 0
    page, asked = opened(browser, tmp_path / "compressive.html")
    links = page.eval_on_selector_all("a[href^='#section-']", "as => as.map(a => a.hash)")
    assert links == [f"#section-{n}" for n in range(1, 9)]
    for link in links[::-1]:  # from the last, so that each must scroll back up
        page.click(f"a[href='{link}']")
        top = page.evaluate(f"document.querySelector('{link}').getBoundingClientRect().top")
        assert page.evaluate("location.hash") == link and abs(top) < 2, link
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
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "docs" / "fifo.svg", tmp_path / "docs" / "fifo.svg")  # its figure
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
