"""What leaves a graded kernel is data, never code: `SanitizeOutputs` strips active content from graded notebooks.

The autograded notebook is what the formgrader shows the instructor (in the Jupyter server's origin, with the
instructor's session), what `nbgrader generate_feedback` turns into the student's feedback HTML, and what anyone
opens in JupyterLab. A student's cell can display anything (`display(HTML('<img onerror=...>'))`, a Javascript
output, a widget) and a student's markdown cell can hold raw HTML, so before the notebook is written:

- outputs keep only the mimetypes of OUTPUT_MIMETYPES; text/html and text/markdown are cleaned with nh3 (an
  allowlist of tags, attributes, style properties and URL schemes; a CSS value only of the shapes of CSS_VALUE:
  colours, lengths, keywords, no function that could fetch), image/svg+xml with an SVG allowlist that
  keeps matplotlib's figures; base64 images must be base64; an image's metadata keeps only a numeric size
  (nbconvert writes it into an unquoted attribute); stream and error outputs are text (nbconvert escapes them);
- a student's markdown cell (any cell nbgrader does not lock) that holds `<` or link syntax is rendered to HTML
  by nbconvert's own markdown renderer (math stays text), cleaned, and stored as that HTML; its attachments keep
  only PNG, JPEG and GIF images; a student's raw cell is cleaned as HTML (nbconvert's HTML includes raw cells);
- MathJax commands that make links or load code (`\\href`, `\\require`, ...) get a full-width backslash, which
  reads the same and is no TeX command;
- the notebook's widget state is dropped.
Each cell that lost something gets a report line. The course's payload (`payload.MIME`) and the judge's
rewritten test outputs are plain data and are left as they are, so no score changes.
"""

from __future__ import annotations

import base64
import binascii
import html
import re
from collections.abc import Callable
from html.parser import HTMLParser

import nh3
from nbconvert.exporters.exporter import ResourcesDict
from nbconvert.filters.markdown_mistune import InvalidNotebook, IPythonRenderer, MarkdownWithMath
from nbformat.notebooknode import NotebookNode
from nbgrader import utils
from nbgrader.preprocessors import NbGraderPreprocessor

from ..payload import MIME
from .report import add_line, cell_label

IMAGE_MIMETYPES = frozenset({"image/png", "image/jpeg", "image/gif"})
OUTPUT_MIMETYPES = frozenset({"text/plain", "text/html", "text/markdown", "image/svg+xml", "application/json",
                              MIME, *IMAGE_MIMETYPES})

HTML_TAGS = frozenset({
    "a", "abbr", "b", "blockquote", "br", "caption", "code", "col", "colgroup", "dd", "del", "details", "div",
    "dl", "dt", "em", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "i", "img", "ins", "kbd", "li", "ol", "p", "pre",
    "q", "s", "samp", "small", "span", "strong", "sub", "summary", "sup", "table", "tbody", "td", "tfoot", "th",
    "thead", "tr", "u", "ul", "var",
})
HTML_ATTRIBUTES = {
    "*": {"style", "title"},
    "a": {"href"},
    "img": {"src", "alt", "width", "height"},
    "td": {"colspan", "rowspan", "align"},
    "th": {"colspan", "rowspan", "align"},
    "ol": {"start"},
}
HTML_STYLES = frozenset({"text-align", "vertical-align", "color", "background-color", "font-weight", "font-style",
                         "white-space"})
SVG_TAGS = frozenset({
    "svg", "g", "defs", "clipPath", "mask", "pattern", "marker", "symbol", "use", "path", "rect", "circle",
    "ellipse", "line", "polyline", "polygon", "text", "tspan", "title", "desc", "linearGradient",
    "radialGradient", "stop",
})
SVG_ATTRIBUTES = {"*": {
    "id", "style", "transform", "clip-path", "clipPathUnits", "mask", "fill", "fill-opacity", "fill-rule", "stroke",
    "stroke-width", "stroke-opacity", "stroke-linecap", "stroke-linejoin", "stroke-dasharray", "stroke-dashoffset",
    "stroke-miterlimit", "opacity", "d", "x", "y", "dx", "dy", "width", "height", "viewBox", "preserveAspectRatio",
    "version", "points", "cx", "cy", "r", "rx", "ry", "x1", "x2", "y1", "y2", "fx", "fy", "offset", "stop-color",
    "stop-opacity", "gradientUnits", "gradientTransform", "patternUnits", "patternTransform", "markerWidth",
    "markerHeight", "refX", "refY", "orient", "font-size", "font-family", "font-weight", "font-style",
    "text-anchor", "dominant-baseline", "xlink:href", "href",
}}
SVG_STYLES = frozenset({
    "fill", "fill-opacity", "fill-rule", "stroke", "stroke-width", "stroke-opacity", "stroke-linecap",
    "stroke-linejoin", "stroke-dasharray", "stroke-dashoffset", "stroke-miterlimit", "opacity", "font-size",
    "font-family", "font-weight", "font-style", "text-anchor", "clip-path", "stop-color", "stop-opacity",
})
# The SVG is shown as an <img> of a data URL, i.e. parsed as XML: it needs its namespaces back.
SVG_NAMESPACES = {"xmlns": "http://www.w3.org/2000/svg", "xmlns:xlink": "http://www.w3.org/1999/xlink"}
URL_ATTRIBUTES = frozenset({"href", "src", "xlink:href", "action", "formaction", "data", "srcdoc", "background"})
URL_SCHEMES = frozenset({"http", "https", "mailto", "data"})
IMAGE_DATA_URL = re.compile(r"data:image/(png|jpeg|gif);base64,[A-Za-z0-9+/=\s]*\Z", re.IGNORECASE)
# MathJax (in JupyterLab, the formgrader and the feedback) typesets student text: these commands link or load code.
MATHJAX_ACTIVE = re.compile(r"\\(href|url|require|class|cssId|style|html|data|mmlToken)(?![A-Za-z])")
FULLWIDTH_BACKSLASH = "\uff3c"  # shows as a backslash, is no TeX command
LINK_SYNTAX = ("<", "](", "]:")
# A CSS value is kept only if it is made of these shapes, separated by spaces or commas (an allowlist: no function
# but colours', so no url(), image-set(), cross-fade(), element(), env(), attr(), var() or expression(); no escape, no
# comment, no !important). An SVG figure may refer to its own parts (`url(#clip1)`), never to anything outside.
_NUMBER = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?"
_CSS_SHAPE = (rf"\#[0-9a-f]{{3,8}}"  # a colour
              rf"|(?:rgba?|hsla?)\(\s*{_NUMBER}(?:deg|%)?(?:\s*[,/]?\s*{_NUMBER}%?){{2,3}}\s*\)"  # a colour
              rf"|{_NUMBER}(?:px|em|rem|ex|ch|pt|pc|cm|mm|in|vw|vh|%)?"  # a number, length or percentage
              rf"|[a-z][a-z-]*"  # a keyword: red, bold, nowrap, square, middle, none
              rf"|url\(\#[a-z_][a-z0-9_.:-]*\)"  # a part of the same figure
              rf"|'[a-z0-9 _-]*'|\"[a-z0-9 _-]*\"")  # a font's name
CSS_VALUE = re.compile(rf"\s*(?:{_CSS_SHAPE})(?:(?:\s*,\s*|\s+)(?:{_CSS_SHAPE}))*\s*", re.IGNORECASE)
CSS_PROPERTY = re.compile(r"\s*([a-z-]+)\s*", re.IGNORECASE)
# Removed without a report line: a figure's or a table's metadata and style sheet, a document's frame (a tag with
# a namespace prefix, like matplotlib's <dc:title>, is metadata too).
INERT_TAGS = frozenset({"metadata", "style", "html", "head", "body"})


def css_value_allowed(value: str) -> bool:
    """Whether a CSS value is only colours, lengths, numbers, keywords, font names and `url(#id)` (`CSS_VALUE`)."""
    return CSS_VALUE.fullmatch(value) is not None


def clean_style(style: str, properties: frozenset[str]) -> str | None:
    """A style attribute with only the declarations of `properties` whose values `css_value_allowed`; None if
    none is left."""
    kept = []
    for declaration in style.split(";"):
        name, colon, value = declaration.partition(":")
        match = CSS_PROPERTY.fullmatch(name)
        if colon and match and match[1].lower() in properties and css_value_allowed(value):
            kept.append(f"{match[1].lower()}: {value.strip()}")
    return "; ".join(kept) or None


def _attribute_filter(styles: frozenset[str]) -> Callable[[str, str, str], str | None]:
    """nh3's attribute filter for a cleaner whose style properties are `styles`: an image's source only as
    PNG/JPEG/GIF data (a remote image would tell the student when and from where the instructor opened the
    page), data: URLs nowhere else; SVG references only to the same figure (`#id`); every CSS value (a style
    attribute, an SVG presentation attribute such as fill) an allowed shape (`clean_style`)."""

    def allowed(tag: str, attribute: str, value: str) -> str | None:
        if attribute in ("href", "xlink:href") and tag != "a":
            return value if value.startswith("#") else None
        if tag == "img" and attribute == "src":
            return value if IMAGE_DATA_URL.match(value.strip()) else None
        if value.strip().lower().startswith("data:"):
            return None
        if attribute == "style":
            return clean_style(value, styles)
        if attribute in styles or attribute == "mask":  # an SVG presentation attribute holds a CSS value
            return value if css_value_allowed(value) else None
        return value

    return allowed


def clean_html(text: str) -> str:
    """`text` (an HTML fragment) with only HTML_TAGS, HTML_ATTRIBUTES, HTML_STYLES and URL_SCHEMES left."""
    return nh3.clean(MATHJAX_ACTIVE.sub(FULLWIDTH_BACKSLASH + r"\1", text), tags=set(HTML_TAGS),
                     attributes={k: set(v) for k, v in HTML_ATTRIBUTES.items()},
                     attribute_filter=_attribute_filter(HTML_STYLES), url_schemes=set(URL_SCHEMES),
                     filter_style_properties=set(HTML_STYLES))


def clean_svg(text: str) -> str:
    """`text` (an SVG document) with only SVG_TAGS, SVG_ATTRIBUTES and SVG_STYLES left: a figure, no script."""
    return nh3.clean(text, tags=set(SVG_TAGS), attributes={k: set(v) for k, v in SVG_ATTRIBUTES.items()},
                     attribute_filter=_attribute_filter(SVG_STYLES), url_schemes=set(URL_SCHEMES),
                     filter_style_properties=set(SVG_STYLES), link_rel=None,
                     set_tag_attribute_values={"svg": dict(SVG_NAMESPACES)})


def render_markdown(source: str, attachments: dict[str, dict[str, str]] | None = None) -> str | None:
    """A student's markdown as HTML (nbconvert's renderer, math kept as text, attachments embedded), or None if it
    can hold no markup or link (no `<`, no `](` or `]:`) and is kept as written."""
    if not any(mark in source for mark in LINK_SYNTAX):
        return None
    try:
        return MarkdownWithMath(renderer=IPythonRenderer(escape=False, attachments=attachments or {})).render(source)
    except InvalidNotebook:  # an image of a missing attachment: show the source as text
        return f"<pre>{html.escape(source)}</pre>"


def clean_markdown(source: str, attachments: dict[str, dict[str, str]] | None = None) -> str:
    """A student's markdown without active MathJax commands; if it has markup or links, rendered and cleaned. The
    HTML is one line, so that a markdown renderer reads it as one HTML block and finds no markdown inside."""
    source = MATHJAX_ACTIVE.sub(FULLWIDTH_BACKSLASH + r"\1", source)
    rendered = render_markdown(source, attachments)
    if rendered is None:
        return source
    return "<div>" + clean_html(rendered).replace("\r", "").replace("\n", "&#10;") + "</div>"


def _is_base64(text: str) -> bool:
    try:
        base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


class _Markup(HTMLParser):
    """The tags, attribute names and URL schemes of an HTML fragment, to say what cleaning took away."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: set[str] = set()
        self.attributes: set[str] = set()
        self.urls: set[str] = set()
        self.css_values = 0  # declarations and SVG attributes of a kept property whose value is no allowed shape
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        for name, value in attrs:
            self.attributes.add(name)
            if name in URL_ATTRIBUTES:
                self.urls.add(re.sub(r"[\s\x00-\x1f]", "", value or "").lower())
            declarations = [d.partition(":")[::2] for d in (value or "").split(";")] if name == "style" else \
                [(name, value or "")] if name in SVG_STYLES or name == "mask" else []
            self.css_values += sum(prop.strip().lower() in HTML_STYLES | SVG_STYLES and not css_value_allowed(v)
                                   for prop, v in declarations)


def removed_markup(before: str, after: str) -> list[str]:
    """What cleaning `before` into `after` removed, as the report says it: tags, event handlers, javascript: URLs,
    CSS values, MathJax commands."""
    old, new = _Markup(before), _Markup(after)
    gone = [f"<{tag}>" for tag in sorted(old.tags - new.tags) if tag not in INERT_TAGS and ":" not in tag]
    if any(name.startswith("on") for name in old.attributes - new.attributes):
        gone.append("event handlers")
    urls = old.urls - new.urls
    if any(url.startswith("javascript:") for url in urls):
        gone.append("javascript: links")
    if any(not url.startswith("javascript:") for url in urls):
        gone.append("URLs that are not http(s), mailto or image data")
    if old.css_values > new.css_values:
        gone.append("CSS values that are not colours, lengths or keywords")
    if MATHJAX_ACTIVE.search(before):
        gone.append("MathJax commands " + ", ".join(sorted({"\\" + m for m in MATHJAX_ACTIVE.findall(before)})))
    return gone


def _text(value: object) -> str:
    """A mimebundle's text: a string, or (as nbformat writes multi-line text) a list of lines."""
    return "".join(map(str, value)) if isinstance(value, list) else str(value)


def _clean_data(data: NotebookNode, removed: list[str]) -> dict[str, object]:
    """An output's mimebundle, allowlisted and cleaned; what went is added to `removed`."""
    kept: dict[str, object] = {}
    for mimetype, value in data.items():
        if mimetype not in OUTPUT_MIMETYPES:
            removed.append(f"the {mimetype} data")
        elif mimetype in IMAGE_MIMETYPES and not (isinstance(value, str) and _is_base64(value)):
            removed.append(f"the {mimetype} data, which is not base64")
        elif mimetype in ("text/html", "image/svg+xml"):
            text = _text(value)
            kept[mimetype] = (clean_html if mimetype == "text/html" else clean_svg)(text)
            removed.extend(removed_markup(text, str(kept[mimetype])))
        elif mimetype == "text/markdown":
            kept[mimetype] = _cleaned_markdown(_text(value), {}, removed)
        else:
            kept[mimetype] = value
    return kept


def _clean_metadata(metadata: NotebookNode, kept: dict[str, object]) -> dict[str, object]:
    """An output's metadata: an image's numeric width and height, the payload's own; nothing else."""
    clean: dict[str, object] = {}
    for mimetype in kept:
        entry = metadata.get(mimetype)
        if mimetype == MIME and entry is not None:
            clean[mimetype] = entry
        elif mimetype in IMAGE_MIMETYPES and isinstance(entry, dict):
            size = {k: v for k, v in entry.items() if k in ("width", "height")
                    and isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0}
            if size:
                clean[mimetype] = size
    return clean


def _clean_outputs(cell: NotebookNode) -> list[str]:
    removed: list[str] = []
    outputs = []
    for output in cell.get("outputs", []):
        if output.output_type in ("display_data", "execute_result"):
            output.data = NotebookNode(_clean_data(output.get("data", {}), removed))
            output.metadata = NotebookNode(_clean_metadata(output.get("metadata", {}), output.data))
            if not output.data:
                continue
        outputs.append(output)
    cell.outputs = outputs
    return removed


def _clean_student_text(cell: NotebookNode) -> list[str]:
    """A student's markdown or raw cell: its source cleaned, its attachments only images."""
    removed: list[str] = []
    attachments, shown = {}, {}
    for name, bundle in cell.get("attachments", {}).items():
        images = {m: v for m, v in bundle.items() if m in IMAGE_MIMETYPES and isinstance(v, str) and _is_base64(v)}
        removed.extend(f"the attachment {name!r} as {m}" for m in sorted(set(bundle) - set(images)))
        if images:
            attachments[name] = images
        shown[name] = images or {"text/plain": ""}  # rendered as a data: URL that the cleaner drops
    if "attachments" in cell:
        cell.attachments = NotebookNode(attachments)
    if cell.cell_type == "markdown":
        cell.source = _cleaned_markdown(cell.source, shown, removed)
    elif "<" in cell.source:
        cleaned = clean_html(cell.source)
        removed.extend(removed_markup(cell.source, cleaned))
        cell.source = cleaned
    return removed


def _cleaned_markdown(source: str, attachments: dict[str, dict[str, str]], removed: list[str]) -> str:
    """clean_markdown(source); what it took from the rendered markdown is added to `removed`."""
    cleaned = clean_markdown(source, attachments)
    removed.extend(removed_markup(render_markdown(source, attachments) or source, cleaned))
    return cleaned


class SanitizeOutputs(NbGraderPreprocessor):
    """Remove active content (script, event handlers, javascript: URLs, frames, widgets, ...) from every output
    and from the student's markdown and raw cells, so the notebook written to disk is data only (after
    JudgeTestCells, before WriteGradingReport, whose report gets a line per cleaned cell)."""

    def preprocess(self, nb: NotebookNode, resources: ResourcesDict) -> tuple[NotebookNode, ResourcesDict]:
        if nb.metadata.pop("widgets", None) is not None:
            add_line(nb, "the notebook's widget state was removed (a graded notebook shows no widgets)")
        for index, cell in enumerate(nb.cells):
            if cell.cell_type == "code":
                removed, where = _clean_outputs(cell), "its output"
            elif not utils.is_locked(cell):
                removed, where = _clean_student_text(cell), "its text"
            else:
                continue
            if removed:
                what = ", ".join(dict.fromkeys(removed))
                add_line(nb, f"{cell_label(cell, index)}: removed from {where}: {what} "
                             "(a graded notebook shows outputs and text as data, never runs them)")
        return nb, resources
