"""Make docs/img/demo-image.png, demo-video.png and demo-speech.png: the web demo's Image, Video and Speech tabs
after one run each, with the shipped models, in headless Chromium.

    python docs/img/screenshot_media.py [--tabs image,video,speech]

Needs the Debian `chromium` package and `pip install playwright` (never `playwright install`).
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
TABS = {"image": ("Image", "#image-run", "#image-stats"), "video": ("Video", "#video-run", "#video-stats"),
        "speech": ("Speech", "#speech-run", "#speech-stats")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tabs", default="image,video,speech")
    args = parser.parse_args()
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from PIL import Image
    from playwright.sync_api import sync_playwright

    from specgen.app.ui import build_demo

    demo = build_demo()  # the shipped models, loaded on the first request
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                            ssr_mode=False)
    try:
        with sync_playwright() as p, tempfile.TemporaryDirectory() as tmp:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS, headless=True)
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.goto(url, wait_until="networkidle")
            for tab in args.tabs.split(","):
                title, run, stats = TABS[tab]
                page.get_by_role("tab", name=title).click()
                page.click(run)
                page.wait_for_function(f"document.querySelector('{stats}')?.innerText.includes('done')",
                                       timeout=300_000)
                page.wait_for_timeout(500)
                raw = Path(tmp) / f"{tab}.png"
                page.screenshot(path=str(raw), full_page=True)
                out = ROOT / "docs" / "img" / f"demo-{tab}.png"
                Image.open(raw).convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT).save(
                    out, optimize=True)
                print(f"wrote {out} ({out.stat().st_size // 1024} KiB)")
            browser.close()
    finally:
        demo.close()


if __name__ == "__main__":
    main()
