"""Student CSS fetches nothing in Chromium (issue 49): every CSS value the output cleaner keeps is a colour, a
length, a number, a keyword, a font's name or a reference inside the same figure, so it fetches nothing even in a
property that takes an image. Each hostile value is hidden in a property the cleaner keeps; what is left of it is
rendered by Chromium in the cleaned HTML and again in every image-taking property, while a loopback HTTP
listener records what reaches it: nothing. The same values uncleaned do reach it (the probe can fail).
"""

from __future__ import annotations

import html
import re

import pytest

from gptcourse.grading.steps.active_content import clean_html, clean_svg

pytestmark = pytest.mark.browser

# Each makes Chromium fetch @URL@ when it is the value of an image-taking property; the cleaner must drop it.
FETCHING_VALUES = [
    'image-set("@URL@/image-set.gif" 1x)',
    "-webkit-image-set(url(@URL@/webkit-image-set.gif) 1x)",
    "image-set(url(@URL@/image-set-url.gif) 1x, url(@URL@/image-set-2x.gif) 2x)",
    "-webkit-cross-fade(url(@URL@/cross-fade-a.gif), url(@URL@/cross-fade-b.gif), 50%)",
    "\\75rl(@URL@/escaped.gif)",
    "\\000075 rl(@URL@/escaped-long.gif)",
    "u\\rl(@URL@/escaped-r.gif)",
    "url(@URL@/plain.gif)",
    "url('@URL@/quoted.gif')",
    "/**/url(@URL@/comment.gif)/**/",
    "linear-gradient(red, blue), url(@URL@/second-layer.gif)",
]
# No fetch in this Chromium by themselves (values that compute another value, syntax it does not read yet): dropped
# all the same.
COMPUTED_VALUES = ["cross-fade(url(@URL@/cross-fade.gif) 50%, red)", "var(--x, red)", "env(safe-area-inset-top, red)",
                   "attr(title color, red)", "element(#a)", "expression(alert(1))",
                   "red /* url(@URL@/in-comment.gif) */", "red !important"]
IMAGE_PROPERTIES = ["background-image", "list-style-image", "border-image-source", "mask-image", "content",
                    "-webkit-mask-image"]


def probe(value: str) -> str:
    """`value` in every image-taking property of an element that shows them (a list item with a border)."""
    value = html.escape(value)
    styles = "; ".join(f"{name}: {value}" for name in IMAGE_PROPERTIES)
    return (f'<ul><li style="display: list-item; border: 10px solid; width: 50px; height: 50px; {styles}">x</li>'
            f'</ul><div style="cursor: {value}, auto">y</div><p style="width:50px;height:50px">'
            f'<span style="background: {value}">z</span></p>')


def kept_values(cleaned: str) -> list[str]:
    """The CSS values left in a cleaned fragment: each style declaration's and each SVG presentation
    attribute's (read here with a regular expression, not the cleaner's parser)."""
    values = []
    for attribute, text in re.findall(r'\s([a-z-]+)="([^"]*)"', cleaned):
        if attribute == "style":
            values += [d.split(":", 1)[1] for d in text.split(";") if ":" in d]
        elif attribute in ("fill", "stroke", "clip-path", "mask", "stop-color"):
            values.append(text)
    return [html.unescape(v) for v in values]


def render(browser, body: str) -> None:
    page = browser.new_page()
    try:
        page.set_content(f"<!doctype html><html><body>{body}</body></html>", wait_until="load")
        page.wait_for_timeout(300)
    finally:
        page.close()


@pytest.mark.parametrize("value", FETCHING_VALUES + COMPUTED_VALUES)
def test_no_kept_css_value_fetches_in_chromium(browser, request_recorder, value: str) -> None:
    value = value.replace("@URL@", request_recorder.url)
    quoted = html.escape(value)  # as an attribute's value
    if value.replace(request_recorder.url, "@URL@") in FETCHING_VALUES:
        request_recorder.paths.clear()
        render(browser, probe(value))
        assert request_recorder.paths, f"the probe is blind: {value!r} fetched nothing even uncleaned"
    cleaned = clean_html(f'<span style="color: {quoted}; font-weight: bold">a</span>'
                         f'<b style="background-color: {quoted}">b</b>') + \
        clean_svg(f'<svg xmlns="http://www.w3.org/2000/svg" width="20" height="20"><rect width="9" height="9" '
                  f'fill="{quoted}" stroke="{quoted}" style="fill: {quoted}; stroke: {quoted}"/></svg>')
    request_recorder.paths.clear()
    render(browser, cleaned + "".join(probe(kept) for kept in kept_values(cleaned)))
    assert request_recorder.paths == [], (value, cleaned, request_recorder.paths)
    assert request_recorder.url not in cleaned and "font-weight:bold" in cleaned, cleaned
