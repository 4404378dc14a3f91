"""The Gradio web demo: one tab per modality, live output coloured by token source, live τ, acceptance per
draft position, tokens/s, and the speedup against plain decoding of the same request.

`build_demo()` builds the Blocks app; nothing is loaded at import. Models load on the first request (or in a
background thread when `specgen demo` starts). `build_demo(text_generator=...)` serves an existing
`TextGenerator` (tests pass a tiny one). One module per tab (text.py, image.py for Image and Video, speech.py);
widgets.py holds what they share, header.py the header, models.py the lazily loaded model holders.
"""

from __future__ import annotations

import logging
import os


__all__ = ["build_demo", "launch_demo"]


def build_demo(text_generator=None, *, model: str | None = None, draft: str | None = None,
               threads: int | None = 1, concurrency_limit: int = 1, text_models=None,
               image_generator=None, image_models=None, speech_generator=None, speech_models=None,
               video_generator=None, video_models=None):
    """The Blocks app. Nothing heavy happens here: models load on the first request."""
    import gradio as gr

    from specgen.app.ui.header import header_markdown
    from specgen.app.ui.image import ImageModels, build_image_tab
    from specgen.app.ui.speech import SpeechModels, build_speech_tab
    from specgen.app.ui.text import TextModels, build_text_tab
    from specgen.app.ui.widgets import MODEL_WORK

    holders = (text_models or TextModels(text_generator, model=model, draft=draft, threads=threads),
               image_models or ImageModels(image_generator, threads=threads),
               speech_models or SpeechModels(speech_generator, threads=threads),
               video_models or ImageModels(video_generator, threads=threads, video=True))
    limits = dict(concurrency_limit=concurrency_limit, concurrency_id=MODEL_WORK)

    def header() -> str:
        return header_markdown(*holders)

    with gr.Blocks(title="specgen") as demo:
        shown = gr.Markdown(header(), elem_id="header")
        with gr.Tabs():
            events = [build_text_tab(gr, holders[0], **limits), build_image_tab(gr, holders[1], **limits),
                      build_image_tab(gr, holders[3], **limits), build_speech_tab(gr, holders[2], **limits)]
        for event in events:
            event.then(header, None, shown, queue=False, api_name=False)
        demo.load(header, None, shown, queue=False, api_name=False)
        # while models load (Gemma's first-time conversion takes minutes), the header follows every 2 s
        refresh = gr.Timer(2.0)

        def follow_loading():
            loading = any(getattr(holder, "loading", False) for holder in holders)
            return header(), gr.Timer(active=loading)

        refresh.tick(follow_loading, None, [shown, refresh], queue=False, api_name=False)
    demo.queue(max_size=64)
    return demo


def launch_demo(args) -> int:
    """`specgen demo`: build, start loading the models in the background, serve until interrupted."""
    from specgen.app.ui.image import ImageModels
    from specgen.app.ui.speech import SpeechModels
    from specgen.app.ui.text import TextModels
    from specgen.errors import InvalidRequest
    from specgen.modalities.memory import limit_malloc_arenas

    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # nothing leaves the machine
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    limit_malloc_arenas()  # before any worker thread allocates: keeps resident memory flat over many requests
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("specgen").setLevel(logging.INFO)  # our own progress (model loading), not every request
    text_models = TextModels(model=getattr(args, "model", None), draft=getattr(args, "draft", None),
                             threads=args.threads, online_draft=getattr(args, "online_draft", None))
    holders = (text_models, ImageModels(threads=args.threads), SpeechModels(threads=args.threads),
               ImageModels(threads=args.threads, video=True))
    demo = build_demo(text_models=holders[0], image_models=holders[1], speech_models=holders[2],
                      video_models=holders[3])
    try:
        demo.launch(server_name=args.host, server_port=args.port, show_error=True, ssr_mode=False,
                    footer_links=["api", "settings"], prevent_thread_lock=True)
    except OSError as exc:
        raise InvalidRequest(f"cannot serve on {args.host}:{args.port}: {exc}") from None
    for holder in holders:  # serving already; the first request waits for the models if they are not ready
        holder.preload()
    demo.block_thread()  # until Ctrl-C
    return 0


if __name__ == "__main__":
    import sys

    from specgen.app.cli import main

    raise SystemExit(main(["demo", *sys.argv[1:]]))
