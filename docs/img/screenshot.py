"""Make docs/img/demo-text.png: the web demo's text tab after one run, in headless Chromium.

    python docs/img/screenshot.py [--out docs/img/demo-text.png]

Uses the default models (assets/code/) when the target checkpoint is there; otherwise a tiny random-initialised
pair built in a temp folder (the caption in the header says which paths were loaded). Needs the Debian
`chromium` package and `pip install playwright` (never `playwright install`).
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


def tiny_pair(folder: Path) -> tuple[str, str]:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    def save(path, seed, layers, hidden):
        chars = "abcdefghijklmnopqrstuvwxyz (){}:=\n"
        vocab = {"<bos>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate(chars)}}
        tok = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
        tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
        tok.decoder = decoders.Fuse()
        torch.manual_seed(seed)
        config = LlamaConfig(vocab_size=len(vocab), hidden_size=hidden, intermediate_size=2 * hidden,
                             num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=256, bos_token_id=0, eos_token_id=1)
        LlamaForCausalLM(config).save_pretrained(path)
        PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>").save_pretrained(path)
        return str(path)

    return save(folder / "target", 0, 2, 32), save(folder / "draft", 1, 1, 16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "demo-text.png")
    args = parser.parse_args()
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from playwright.sync_api import sync_playwright

    from specgen.app.ui import build_demo
    from specgen.modalities.text.generator import TextGenerator, default_models

    target, draft = default_models()
    with tempfile.TemporaryDirectory() as tmp:
        if (Path(target) / "model.safetensors").exists():
            generator, method, prompt = TextGenerator(), "draft", "import os\n\n\ndef main("
        else:
            generator, method, prompt = TextGenerator(*tiny_pair(Path(tmp))), "ngram", "abc abc (x = abc abc ("
        demo = build_demo(generator)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        _, url, _ = demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                                ssr_mode=False)
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS, headless=True)
                page = browser.new_page(viewport={"width": 1100, "height": 900})
                page.goto(url, wait_until="networkidle")
                page.fill("#text-prompt textarea", prompt)
                page.click("#text-method input")
                page.click(f"#text-method li[aria-label='{method}']")
                page.fill("#text-max-new-tokens input", "48")
                page.click("#text-run")
                page.wait_for_function("document.querySelector('#text-stats')?.innerText.includes('done')",
                                       timeout=120_000)
                page.wait_for_timeout(500)
                raw = Path(tmp) / "shot.png"
                page.screenshot(path=str(raw), full_page=True)
                browser.close()
        finally:
            demo.close()
        from PIL import Image

        image = Image.open(raw).convert("RGB")
        image.quantize(colors=64, method=Image.Quantize.MEDIANCUT).save(args.out, optimize=True)
    print(f"wrote {args.out} ({args.out.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main()
