"""The web demo in a real browser: headless Debian Chromium driven by Playwright (never `playwright install`), on a
tiny random model pair saved to a temp folder. Skips when Chromium or Playwright is missing (CI installs both)."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlparse

import pytest

CHROMIUM = "/usr/bin/chromium"
if not os.path.exists(CHROMIUM):
    pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")

from tiny_models import save_tiny, save_tiny_image_model, serve  # noqa: E402
from specgen.app.ui import build_demo  # noqa: E402
from specgen.modalities.text.generator import TextGenerator  # noqa: E402

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]






@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    generator = TextGenerator(save_tiny(root / "target", 0), save_tiny(root / "draft", 1, layers=1, hidden=16))
    from specgen.modalities.image.generator import ImageGenerator

    image_generator = ImageGenerator(*save_tiny_image_model(root / "image", num_codes=16, grid=4))
    video_generator = ImageGenerator(*save_tiny_image_model(root / "video", num_codes=16, grid=4, frames=3))
    yield from serve(build_demo(generator, image_generator=image_generator, video_generator=video_generator))


@pytest.fixture(scope="module")
def page(app_url):
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        hosts = []
        page.on("request", lambda request: hosts.append(urlparse(request.url).hostname))
        page.goto(app_url, wait_until="networkidle")
        page.hosts = hosts
        try:
            yield page
        finally:
            browser.close()


def test_text_tab_runs_in_the_browser(page, tmp_path):
    page.fill("#text-prompt textarea", "abc abc (x")
    page.click("#text-run")
    page.wait_for_function("document.querySelector('#text-stats')?.innerText.includes('done')", timeout=30_000)
    output = page.inner_text("#text-output")
    assert "abc abc (x" in output and "accepted" in output  # the prompt, then coloured tokens and the legend
    assert len(page.query_selector_all("#text-output .token.highlighted")) >= 1
    stats = page.inner_text("#text-stats")
    assert "τ" in stats and "measured speedup vs plain decoding" in stats
    assert "auto chose" in stats and "predicted speedup of each candidate" in stats  # the default's timeline
    shot = Path(os.environ.get("SPECGEN_SCREENSHOT_DIR", tmp_path)) / "demo-text.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000


def test_image_tab_runs_in_the_browser(page, tmp_path):
    page.get_by_role("tab", name="Image").click()
    page.click("#image-run")
    page.wait_for_function("document.querySelector('#image-stats')?.innerText.includes('done')", timeout=60_000)
    assert page.query_selector("#image-output img") is not None
    stats = page.inner_text("#image-stats")
    assert "τ" in stats and "measured speedup vs plain decoding" in stats
    shot = Path(os.environ.get("SPECGEN_SCREENSHOT_DIR", tmp_path)) / "demo-image.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000


def test_video_tab_runs_in_the_browser(page):
    page.get_by_role("tab", name="Video").click()
    page.click("#video-run")
    page.wait_for_function("document.querySelector('#video-stats')?.innerText.includes('done')", timeout=60_000)
    image = page.query_selector("#video-output img")
    assert image is not None and ".gif" in (image.get_attribute("src") or "")
    assert "measured speedup vs plain decoding" in page.inner_text("#video-stats")


def test_the_page_asks_nothing_of_other_hosts(page):
    assert page.hosts and set(page.hosts) <= {"127.0.0.1", "localhost"}, set(page.hosts)
