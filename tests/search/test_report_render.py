"""The HTML report of a real study, loaded in headless Chromium: the DOM has the tables and the
plots, and the screenshot is a page (not a blank or an error page). Chromium comes from Debian's
package (scripts/setup_chromium.sh); it runs without network, GPU or sandbox."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from search.report import write_html
from tests.search.test_report import build_real_study, real_input

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--hide-scrollbars", "--mute-audio"]


def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("chromium is missing: run `bash scripts/setup_chromium.sh` first", pytrace=False)


def run_chromium(tmp: Path, page: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    profile = tmp / "chromium-profile"
    profile.mkdir(exist_ok=True)
    done = subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}", *extra, page.as_uri()],
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    folder = build_real_study(tmp_path_factory.getbasetemp())
    inp = real_input(folder)
    out = tmp_path_factory.mktemp("render") / "report.html"
    write_html(inp, out)
    return out, len(inp.view.records)


@pytest.mark.e2e
def test_dom_has_tables_and_plots(rendered: tuple[Path, int], tmp_path: Path) -> None:
    page, n_records = rendered
    dom = run_chromium(tmp_path, page, "--dump-dom").stdout
    trials = re.search(r'<table id="trials".*?<tbody>(.*?)</tbody>', dom, re.S)
    assert trials, "the trials table is missing from the rendered DOM"
    assert trials.group(1).count("<tr") == n_records
    for figure in ("objective-plot", "startup-plot"):
        block = re.search(rf'<figure id="{figure}">(.*?)</figure>', dom, re.S)
        assert block and "<svg" in block.group(1) and "<path" in block.group(1), f"{figure} did not render"
    assert "Pareto front" in dom and 'id="failures"' in dom and 'class="cmd"' in dom


@pytest.mark.e2e
def test_screenshot_is_a_page(rendered: tuple[Path, int], tmp_path: Path) -> None:
    page, _ = rendered
    shot = tmp_path / "report.png"
    run_chromium(tmp_path, page, f"--screenshot={shot}", "--window-size=1280,2400")
    with Image.open(shot) as image:
        assert image.size == (1280, 2400)
        rgb = image.convert("RGB")
        colors = rgb.getcolors(maxcolors=1 << 16)
        # Text, tables and plots give thousands of colors; a blank or error page gives a handful.
        assert colors is None or len(colors) > 500, f"only {len(colors)} colors: blank page?"
        # Something is drawn at the top (title), not only white.
        top = rgb.crop((0, 0, 1280, 200)).getextrema()
        assert any(low < 100 for low, _ in top)
