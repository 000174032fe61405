"""`active_content.SanitizeOutputs`: hostile outputs and markdown -> what remains, checked by an independent parser.

The reference is Python's html.parser: every tag and attribute left must be on the allowlist the test states here
(not the module's constants), no attribute is an event handler, no URL is javascript:. A matplotlib PNG and SVG,
a pandas-like table and `$x^2$` math must survive.
"""

from __future__ import annotations

import base64
import html
import io
import re
from html.parser import HTMLParser

import nbformat
import pytest
from nbconvert.filters.markdown_mistune import markdown2html_mistune
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from gptcourse.grading.payload import MIME
from gptcourse.grading.steps.active_content import SanitizeOutputs
from gptcourse.grading.steps.report import WriteGradingReport, report_lines

ALLOWED_HTML = {"a", "abbr", "b", "blockquote", "br", "caption", "code", "col", "colgroup", "dd", "del", "details",
                "div", "dl", "dt", "em", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "i", "img", "ins", "kbd", "li",
                "ol", "p", "pre", "q", "s", "samp", "small", "span", "strong", "sub", "summary", "sup", "table",
                "tbody", "td", "tfoot", "th", "thead", "tr", "u", "ul", "var"}
ALLOWED_SVG = {"svg", "g", "defs", "clippath", "path", "rect", "use", "circle", "line", "polyline", "polygon",
               "text", "tspan", "title"}
FORBIDDEN_ATTRIBUTES = {"srcdoc", "formaction", "action", "xmlns:ev", "class", "id"}
PNG_1PX = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360f8cfc0f01f0005000201e3a5c6ad0000000049454e44ae426082")).decode()

HOSTILE_HTML = [
    '<img src="x" onerror="window.__pwned=1">',
    "<script>window.__pwned=1</script><b>bold</b>",
    '<a href="javascript:window.__pwned=1">click</a>',
    '<a href=" JaVaScRiPt:window.__pwned=1">click</a>',
    '<iframe srcdoc="<script>parent.__pwned=1</script>"></iframe>',
    '<object data="x.swf"></object><embed src="x.swf"><form action="/api/contents"><button>go</button></form>',
    '<svg onload="window.__pwned=1"><script>window.__pwned=1</script></svg>',
    '<math><mtext><table><mglyph><style><img src=x onerror="window.__pwned=1">',
    '<div style="background:url(javascript:alert(1))" onmouseover="window.__pwned=1">hover</div>',
    '<img src="data:text/html;base64,PHNjcmlwdD4=">',
    '<meta http-equiv="refresh" content="0;url=javascript:alert(1)"><base href="javascript:alert(1)//">',
    '<details open ontoggle="window.__pwned=1">x</details>',
    "$\\href{javascript:alert(1)}{click}$ and \\(\\require{html}\\)",
]
HOSTILE_SVG = [
    '<svg xmlns="http://www.w3.org/2000/svg" onload="window.__pwned=1"><rect width="1" height="1"/></svg>',
    '<svg xmlns="http://www.w3.org/2000/svg"><script>window.__pwned=1</script></svg>',
    '<svg xmlns="http://www.w3.org/2000/svg"><a xlink:href="javascript:alert(1)"><text>x</text></a></svg>',
    '<svg xmlns="http://www.w3.org/2000/svg"><foreignObject><img src="x" onerror="alert(1)"/></foreignObject>'
    '<animate attributeName="href" to="javascript:alert(1)"/><set attributeName="onclick" to="alert(1)"/>'
    '<use href="data:image/svg+xml;base64,PHN2ZyBvbmxvYWQ9YWxlcnQoMSk+"/></svg>',
    # no script, but a remote fetch tells the student when and from where the instructor opened the page
    '<img src="https://tracker.example/pixel.png"><img src="//tracker.example/p.png">',
    '<span style="color: red; background-color: url(https://tracker.example/p)">x</span>',
    '<span style="color: \\75rl(https://tracker.example/p)">x</span>',
    '<svg><rect width="1" height="1" fill="url(https://tracker.example/p.svg#a)" style="stroke: url(//t.example/s)"/>'
    '</svg>',
]
# CSS values that could fetch (or compute one that does), each hidden in a property the cleaner keeps: only colours,
# lengths, keywords and `url(#id)` within a figure may stay (issue 49).
TRACKER = "tracker.example"
HOSTILE_CSS_VALUES = [
    f'image-set("https://{TRACKER}/a.png" 1x)',
    f"-webkit-image-set(url(https://{TRACKER}/a.png) 1x)",
    f"cross-fade(url(https://{TRACKER}/a.png), red, 50%)",
    "element(#secret)",
    "env(safe-area-inset-top, red)",
    "attr(data-x color, red)",
    "var(--x, red)",
    f"\\75rl(https://{TRACKER}/a)",
    f"\\000075rl(https://{TRACKER}/a)",
    f"ur\\l(https://{TRACKER}/a)",
    "red/**/",
    f"red /* url(https://{TRACKER}/a) */",
    "expression(alert(1))",
    "red !important",
    f"url('https://{TRACKER}/a')",
    f"url(#a) , url(https://{TRACKER}/a)",
]
KEPT_CSS_VALUES = ["red", "#1f77b4", "rgb(12, 34, 56)", "rgba(0 0 0 / 50%)", "hsl(120, 50%, 50%)", "0.8", "-0.5ex",
                   "2px", "bold", "nowrap"]
HOSTILE_MARKDOWN = [
    "Hi <img src=x onerror='window.__pwned=1'>",
    "[click me](javascript:window.__pwned=1) and [ref][r]\n\n[r]: javascript:alert(1)",
    "<script>window.__pwned=1</script>\n\n```\ncode\n\n[x](javascript:alert(2))\n```",
    "<iframe srcdoc='&lt;script&gt;parent.__pwned=1&lt;/script&gt;'></iframe>",
    "$\\href{javascript:alert(1)}{x}$ \\class{a}{b} \\cssId{c}{d} \\style{e}{f}",
]


class Inventory(HTMLParser):
    """Every tag, attribute and URL of an HTML/SVG text (the test's own reading of the result)."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: set[str] = set()
        self.attributes: list[tuple[str, str, str]] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.attributes += [(tag, name, value or "") for name, value in attrs]


def assert_inert(text: str, allowed_tags: set[str]) -> None:
    found = Inventory(text)
    assert found.tags <= allowed_tags, (found.tags - allowed_tags, text)
    for tag, name, value in found.attributes:
        assert not name.startswith("on") and name not in FORBIDDEN_ATTRIBUTES, (tag, name, text)
        url = re.sub(r"[\s\x00-\x1f]", "", value).lower()
        assert "javascript:" not in url, (tag, name, value)
        if url.startswith("data:"):
            assert re.match(r"data:image/(png|jpeg|gif);base64,", url), (tag, name, value)
        if tag != "a" and name in ("href", "xlink:href"):
            assert value.startswith("#"), (tag, name, value)
        if tag == "img" and name == "src":
            assert url.startswith("data:image/"), (tag, name, value)  # never a remote image
        assert "\\" not in value and not re.search(r"url\((?!['\"]?#)", url), (tag, name, value)
        if name == "style" or name in ("fill", "stroke", "clip-path", "mask", "stop-color"):  # CSS values
            functions = set(re.findall(r"([a-z-]*)\(", value.lower()))
            assert functions <= {"rgb", "rgba", "hsl", "hsla", "url"} and "/*" not in value, (tag, name, value)
    for macro in ("\\href", "\\require", "\\class", "\\cssId", "\\style", "\\url"):
        assert macro not in text, (macro, text)


def graded(*cells: nbformat.NotebookNode, **metadata: object) -> nbformat.NotebookNode:
    nb = new_notebook(cells=list(cells), metadata=metadata)
    nb, _ = SanitizeOutputs().preprocess(nb, {})
    return nb


def display(data: dict[str, object], metadata: dict[str, object] | None = None) -> nbformat.NotebookNode:
    return new_output("display_data", data=data, metadata=metadata or {})


def matplotlib_figure(fmt: str) -> str:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([1, 3, 2], label="$x^2$")
    ax.set_title("loss")
    buffer = io.BytesIO()
    fig.savefig(buffer, format=fmt)
    plt.close(fig)
    return buffer.getvalue().decode() if fmt == "svg" else base64.b64encode(buffer.getvalue()).decode()


@pytest.mark.parametrize("text", HOSTILE_HTML)
def test_hostile_html_output_keeps_only_allowlisted_markup(text: str) -> None:
    nb = graded(new_code_cell(outputs=[display({"text/html": text, "text/plain": "x"})]))
    (output,) = nb.cells[0].outputs
    assert output.data["text/plain"] == "x"
    assert_inert(output.data["text/html"], ALLOWED_HTML)
    assert any(line.startswith("cell 1 (added by you): ") for line in report_lines(nb)), report_lines(nb)


@pytest.mark.parametrize("text", HOSTILE_SVG)
def test_hostile_svg_output_keeps_only_allowlisted_markup(text: str) -> None:
    nb = graded(new_code_cell(outputs=[display({"image/svg+xml": text})]))
    assert_inert(nb.cells[0].outputs[0].data["image/svg+xml"], ALLOWED_SVG)


@pytest.mark.parametrize("value", HOSTILE_CSS_VALUES)
def test_css_values_that_are_no_colour_length_or_keyword_are_dropped(value: str) -> None:
    """Each property the cleaners keep (HTML's color, SVG's fill, in a style and as an attribute) keeps a
    value only of an allowed shape: the rest of the style stays, the hostile value goes."""
    value = html.escape(value)  # as an attribute's value
    nb = graded(new_code_cell(outputs=[display({
        "text/html": f'<span style="font-weight: bold; color: {value}">a</span>'
                     f'<b style="background-color: {value}">b</b>',
        "image/svg+xml": f'<svg xmlns="http://www.w3.org/2000/svg"><rect fill="{value}" stroke="red" '
                         f'style="stroke-width: 2px; fill: {value}"/></svg>'})]))
    data = nb.cells[0].outputs[0].data
    assert_inert(data["text/html"], ALLOWED_HTML)
    assert_inert(data["image/svg+xml"], ALLOWED_SVG)
    html_styles = {(tag, v) for tag, name, v in Inventory(data["text/html"]).attributes if name == "style"}
    assert html_styles == {("span", "font-weight:bold")}, data["text/html"]
    rect = {name: v for tag, name, v in Inventory(data["image/svg+xml"]).attributes if tag == "rect"}
    assert rect == {"stroke": "red", "style": "stroke-width:2px"}, data["image/svg+xml"]
    for text in data.values():
        assert TRACKER not in text and "alert" not in text and "--x" not in text, text
    assert any("CSS values that are not colours, lengths or keywords" in line for line in report_lines(nb))


@pytest.mark.parametrize("value", KEPT_CSS_VALUES)
def test_colours_lengths_and_keywords_are_kept(value: str) -> None:
    nb = graded(new_code_cell(outputs=[display({"text/html": f'<span style="color: {value}">a</span>'})]))
    styles = [v for _, name, v in Inventory(nb.cells[0].outputs[0].data["text/html"]).attributes if name == "style"]
    assert styles == [f"color:{value}"], styles
    assert report_lines(nb) == []


@pytest.mark.parametrize("source", HOSTILE_MARKDOWN)
def test_hostile_student_markdown_is_stored_as_clean_html(source: str) -> None:
    nb = graded(new_markdown_cell(source))
    cleaned = nb.cells[0].source
    assert_inert(cleaned, ALLOWED_HTML)
    assert_inert(markdown2html_mistune(cleaned), ALLOWED_HTML)  # rendered again as markdown, it stays inert
    assert report_lines(nb)


def test_active_mimetypes_widgets_and_bad_images_are_dropped() -> None:
    cell = new_code_cell(outputs=[
        display({"application/javascript": "window.__pwned=1", "text/plain": "<Javascript object>"}),
        display({"application/vnd.jupyter.widget-view+json": {"model_id": "m"}}),
        display({"text/latex": "$\\href{javascript:alert(1)}{x}$", "text/plain": "latex"}),
        display({"image/png": '"><script>alert(1)</script>'}),
        display({"image/png": PNG_1PX}, {"image/png": {"width": "1 onerror=alert(1)", "height": 5},
                                         "isolated": True}),
        new_output("stream", name="stdout", text="<script>printed as text</script>"),
    ])
    nb = graded(cell, widgets={"application/vnd.jupyter.widget-state+json": {"state": {}}})
    outputs = nb.cells[0].outputs
    assert [dict(o.get("data", {})) for o in outputs[:3]] == [
        {"text/plain": "<Javascript object>"}, {"text/plain": "latex"}, {"image/png": PNG_1PX}]
    assert outputs[2].metadata == {"image/png": {"height": 5}}
    assert outputs[3].text == "<script>printed as text</script>"  # stream text: nbconvert escapes it
    assert "widgets" not in nb.metadata
    (line,) = [line for line in report_lines(nb) if line.startswith("cell 1")]
    assert "application/javascript" in line and "widget-view" in line and "text/latex" in line


def test_figures_tables_math_payload_and_locked_cells_survive() -> None:
    svg, png = matplotlib_figure("svg"), matplotlib_figure("png")
    table = ('<table border="1" class="dataframe"><thead><tr style="text-align: right;"><th></th><th>a</th></tr>'
             "</thead><tbody><tr><th>0</th><td>1.5</td></tr></tbody></table>")
    payload = {"test_id": "02.causal_mask.visible", "outputs": {"x": 1}}
    instructor = new_markdown_cell("Read <b>this</b>: [docs](https://pytorch.org) and $x^2$.")
    instructor.metadata["nbgrader"] = {"grade": False, "solution": False, "locked": True, "grade_id": "intro"}
    nb = graded(
        instructor,
        new_markdown_cell("My answer: $x^2 > y$ and *so* on."),
        new_markdown_cell("Math with markup: $x^2 < y$ and <b>so</b> on."),
        new_markdown_cell("See [the paper](https://arxiv.org/abs/1706.03762), $x^2$."),
        new_code_cell(outputs=[display({"image/png": png, "text/plain": "<Figure>"}),
                               display({"image/svg+xml": svg}),
                               display({"text/html": table, "text/plain": "df"}),
                               display({"text/markdown": "$x^2$", "text/plain": "md"}),
                               display({MIME: payload, "text/plain": "payload"})]),
    )
    assert nb.cells[0] == instructor and nb.cells[1].source == "My answer: $x^2 > y$ and *so* on."
    assert "$x^2 &lt; y$ and <b>so</b> on." in nb.cells[2].source  # MathJax reads the text: x^2 < y
    assert "$x^2$" in nb.cells[3].source and 'href="https://arxiv.org/abs/1706.03762"' in nb.cells[3].source
    outputs = nb.cells[4].outputs
    assert outputs[0].data["image/png"] == png
    kept_svg = outputs[1].data["image/svg+xml"]
    assert kept_svg.count("<path") == svg.count("<path") and kept_svg.count("<use") == svg.count("<use")
    assert 'xmlns="http://www.w3.org/2000/svg"' in kept_svg and 'xmlns:xlink="http://www.w3.org/1999/xlink"' in kept_svg
    nbformat.validate(nb)
    from xml.etree import ElementTree

    ElementTree.fromstring(kept_svg)  # an <img> of a data URL reads the SVG as XML
    found = Inventory(outputs[2].data["text/html"])
    assert {"table", "thead", "tbody", "tr", "th", "td"} <= found.tags
    assert ("tr", "style", "text-align:right") in found.attributes and ">1.5<" in outputs[2].data["text/html"]
    assert outputs[3].data["text/markdown"] == "$x^2$"
    assert outputs[4].data[MIME] == payload
    assert report_lines(nb) == []


def test_report_cell_shows_student_text_as_text() -> None:
    """A report line quotes a file name or an exception message: the report cell must not render it as markup."""
    hostile = "cell 4 (added by you) wrote <img src=x onerror=alert(1)> ```` [x](javascript:alert(1)) *$\\href{}$*"
    nb = new_notebook(cells=[], metadata={"gptcourse": {"report": [hostile]}})
    info = {"student": "s", "assignment": "a", "notebook": "a"}
    reports = WriteGradingReport()
    reports.directory = str(pytest.importorskip("pathlib").Path(__import__("tempfile").mkdtemp()))
    nb, _ = reports.preprocess(nb, {"nbgrader": info})
    rendered = markdown2html_mistune(nb.cells[0].source)
    found = Inventory(rendered)
    assert found.tags <= {"p", "strong", "pre", "code", "div", "span"}, (found.tags, rendered)  # highlighted code
    assert {name for _, name, _ in found.attributes} <= {"class"}, found.attributes
    assert "&lt;img src=x onerror=alert(1)&gt;" in rendered and "[x](javascript:alert(1))" in rendered


def test_student_attachments_and_raw_cells_are_cleaned() -> None:
    """nbconvert's HTML includes a raw cell's source and embeds a markdown cell's attachments."""
    markdown = new_markdown_cell("![plot](attachment:plot.png) ![page](attachment:page.html)")
    markdown.attachments = {"plot.png": {"image/png": PNG_1PX},
                            "page.html": {"text/html": "<script>window.__pwned=1</script>"}}
    raw = nbformat.v4.new_raw_cell('<img src="x" onerror="window.__pwned=1">raw text')
    nb = graded(markdown, raw)
    assert dict(nb.cells[0].attachments) == {"plot.png": {"image/png": PNG_1PX}}
    assert f'src="data:image/png;base64,{PNG_1PX}"' in nb.cells[0].source
    assert_inert(nb.cells[0].source, ALLOWED_HTML)
    assert_inert(nb.cells[1].source, ALLOWED_HTML)
    assert "raw text" in nb.cells[1].source
    lines = report_lines(nb)
    assert any("'page.html' as text/html" in line for line in lines) and any("cell 2" in line for line in lines)
