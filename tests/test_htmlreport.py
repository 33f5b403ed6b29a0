"""bench report (harness/analysis/html_report.py): one self-contained HTML page.

Always run: the page is parsed (html.parser), every image is a data: URI that
decodes as PNG or SVG, nothing points outside the file, every section is there
with what it should hold. When a Chromium binary is installed, the page is
also rendered headless and the screenshot checked for being more than blank;
without one that test is skipped, saying so.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from test_sweep import synthetic_sweep

from harness.analysis import html_report as htmlreport
from harness.analysis.documents import write_json
from harness.cli import main as bench

from test_results import write_comparison

PNG = b"\x89PNG\r\n\x1a\n"
VOID = {"meta", "img", "br", "hr", "input", "link", "col", "area", "base", "source", "wbr"}
# Elements that would load or run something from elsewhere.
FORBIDDEN = {"script", "link", "iframe", "object", "embed", "frame", "audio", "video", "base"}
URL_ATTRS = {"src", "href", "srcset", "data", "action", "poster", "background", "formaction", "xlink:href"}


class Page(HTMLParser):
    """Tags, attributes, section ids, images, text, and whether elements nest properly."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.text: list[str] = []
        self.doctype = ""

    def handle_decl(self, decl: str) -> None:
        self.doctype = decl

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1] if self.stack else 'nothing'}")
            return
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def of(self, tag: str) -> list[dict[str, str | None]]:
        return [attrs for t, attrs in self.tags if t == tag]

    @property
    def all_text(self) -> str:
        return " ".join(" ".join(self.text).split())


def parse(text: str) -> Page:
    page = Page()
    page.feed(text)
    page.close()
    return page


def decode_image(src: str) -> tuple[str, bytes]:
    head, _, data = src.partition(",")
    assert head in ("data:image/png;base64", "data:image/svg+xml;base64"), head[:60]
    return head[5:].split(";")[0], base64.b64decode(data, validate=True)


def check_self_contained(text: str) -> Page:
    """The checks every report must pass; returns the parsed page."""
    page = parse(text)
    assert page.doctype.lower() == "doctype html"
    assert not page.errors, page.errors[:5]
    assert not page.stack, f"unclosed: {page.stack}"
    assert not [t for t, _ in page.tags if t in FORBIDDEN]
    for tag, attrs in page.tags:
        for name, value in attrs.items():
            if name in URL_ATTRS and value is not None:
                ok = value.startswith("#") or value.startswith("data:image/")
                assert ok, f"<{tag} {name}={value[:80]!r}> points outside the file"
    assert "url(" not in text and "@import" not in text  # CSS that would fetch
    ids = [attrs.get("id") for attrs in page.of("section")]
    assert ids == [s.id for s in htmlreport.SECTIONS]
    assert [a.get("href") for a in page.of("a")][: len(ids)] == [f"#{i}" for i in ids]  # the navigation
    for attrs in page.of("img"):
        kind, data = decode_image(attrs["src"] or "")
        if kind == "image/png":
            assert data.startswith(PNG)
        else:
            svg = data.decode("utf-8")
            assert "<svg" in svg and 'href="http' not in svg
        assert attrs.get("alt")
    return page


def add_ipc(folder: Path) -> None:
    """Give every run file an IPC budget section, as a server with request timelines fills it."""
    spans = ["request.encode", "request.wire", "request.decode", "request.queue", "output.queue"]
    spans += ["output.encode", "output.wire", "output.decode", "ipc", "step.wire"]
    for path in folder.glob("*-r*-*.json"):
        doc = json.loads(path.read_text())
        scale = 0.5 if doc["codec"] == "msgspec" else 1.0
        doc["ipc"] = {
            "spans_us": {
                name: {
                    "count": 4,
                    "p50_us": 10.0 * (i + 1) * scale,
                    "p99_us": 30.0 * (i + 1),
                    "mean_us": 12.0 * (i + 1),
                }
                for i, name in enumerate(spans)
            },
            "requests": 4,
            "share_of_ttft": 0.05 * scale,
            "loop_lag_ms": {"p99": 1.5, "max": 2.0, "samples": 10},
        }
        path.write_text(json.dumps(doc))


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("report")
    compare = write_comparison(
        root / "run",
        {"pickle": {"enc_us": 30.0, "failed": False}, "msgspec": {"enc_us": 10.0, "scale": 0.8, "failed": False}},
        repeat=3,
        noise=0.02,
    )
    add_ipc(root / "run")
    solo = write_comparison(root / "solo", {"msgspec-oob": {"enc_us": 5.0}}, repeat=2, name="solo.json")
    sweep = write_json(root / "sweep-20260101-000000.json", synthetic_sweep())
    return {"compare": compare, "folder": root / "run", "solo": solo, "sweep": sweep, "root": root}


@pytest.fixture(scope="module")
def full_report(results: dict[str, Path]) -> str:
    """The page of a compare file (three rounds, verdicts, IPC budgets) and a sweep document."""
    return htmlreport.build_report([str(results["compare"]), str(results["sweep"])], title="codecs <A&B>")


def test_report_holds_every_section_and_nothing_from_outside(full_report: str) -> None:
    text = full_report
    page = check_self_contained(text)
    words = page.all_text
    assert "codecs <A&B>" in words and "<A&B>" not in text  # escaped
    # Comparison: the table and the verdicts of msgspec against pickle.
    assert "compare.json" in words and "Verdicts against pickle" in words
    assert "faster by" in words and "req enc µs" in words
    verdict_cells = [a for a in page.of("td") if "faster" in (a.get("class") or "")]
    assert verdict_cells
    # Budget: codec bars (an image) and the IPC table from each run's ipc section.
    assert "IPC mean" in words and "IPC % TTFT" in words
    # Sweep: both plots and the crossings in words.
    for crossing in synthetic_sweep()["crossings"]:
        assert crossing["text"] in words
    # Metadata: flags and versions of the sweep document; runs made by the test carry none beyond flags.
    assert "Flags" in words
    images = page.of("img")
    alts = [a["alt"] for a in images]
    assert alts == [
        "CDF of TTFT and TPOT per codec",
        "codec and IPC budget per codec",
        "TTFT over the course of each run",
        "sweep micro curves",
        "sweep e2e curves",
    ]


def test_runs_given_as_a_folder_are_compared_and_metadata_shown(results: dict[str, Path]) -> None:
    text = htmlreport.build_report([str(results["folder"]), str(results["solo"])])
    page = check_self_contained(text)
    words = page.all_text
    assert "runs given directly: run" in words  # the folder's runs, grouped by codec
    assert "solo.json" in words and "One measured arm: nothing to judge." in words
    assert "No sweep document given" in words
    assert "codec" in words and "round" in words  # the flags table (make_result's flags: codec, round)


def test_svg_images_are_self_contained(results: dict[str, Path]) -> None:
    text = htmlreport.build_report([str(results["solo"])], fmt="svg")
    page = check_self_contained(text)
    assert page.of("img") and all((a["src"] or "").startswith("data:image/svg+xml;base64,") for a in page.of("img"))


def test_cli_writes_the_page_and_reports_bad_input(
    results: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sub" / "report.html"
    assert bench(["report", str(results["solo"]), "-o", str(out)]) == 0
    assert "Report written to" in capsys.readouterr().out
    check_self_contained(out.read_text())
    inputs = htmlreport.classify([str(results["root"])])  # a folder: its sweep documents (no run files on top)
    assert [p.name for p, _ in inputs.sweeps] == ["sweep-20260101-000000.json"] and not inputs.runs
    assert bench(["report", str(tmp_path / "missing.json"), "-o", str(out)]) == 2
    assert "no such file" in capsys.readouterr().err


def test_a_section_added_to_the_list_is_rendered_with_its_title_and_in_the_nav(
    results: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def render_run_count(ctx: htmlreport.ReportContext) -> str:
        return f"<p>{len(ctx.entries)} runs of {htmlreport.esc(', '.join(ctx.codecs))}</p>"

    added = htmlreport.Section("run-count", "Runs counted", render_run_count)
    monkeypatch.setattr(htmlreport, "SECTIONS", (*htmlreport.SECTIONS, added))
    out = tmp_path / "report.html"
    assert bench(["report", str(results["compare"]), "-o", str(out)]) == 0
    text = out.read_text()
    page = check_self_contained(text)  # its id among the sections, its link in the navigation, in order
    assert '<nav><a href="#summary">Summary</a>' in text and '<a href="#run-count">Runs counted</a></nav>' in text
    assert '<section id="run-count">\n<h2>Runs counted</h2>\n<p>6 runs of pickle, msgspec</p>\n</section>' in text
    assert "Run metadata" in page.all_text  # the others are still there


def _chromium() -> str | None:
    return next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)


@pytest.mark.slow
@pytest.mark.chromium  # skipped without a browser: the HTML checks above still run
def test_report_renders_in_headless_chromium(full_report: str, tmp_path: Path) -> None:
    browser = _chromium()
    assert browser is not None
    from PIL import Image

    page = tmp_path / "report.html"
    page.write_text(full_report)
    shot = tmp_path / "shot.png"
    cmd = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1300,5000",
        f"--screenshot={shot}",
        page.as_uri(),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert shot.is_file(), done.stderr[-2000:]
    with Image.open(shot) as im:
        gray = im.convert("L")
        width, height = gray.size
        assert (width, height) == (1300, 5000)
        dark = sum(gray.histogram()[:200])  # pixels clearly darker than the white page
        assert dark > 0.01 * width * height, "the screenshot is (nearly) blank"
        colors = im.convert("RGB").getcolors(maxcolors=1 << 20)
        assert colors is not None and len(colors) > 100  # text, tables and plots, not a flat page
        # The plots rendered: a band lower down holds many colours too (images decoded, not broken icons).
        band = im.convert("RGB").crop((0, 1500, width, 3500)).getcolors(maxcolors=1 << 20)
        assert band is not None and len(band) > 50
