"""The settings of `specgen train head --method eagle|poss|mtp|falcon` (modalities/text/training/eagle.py), apart
from the trainer so the command line reads them without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

from specgen.modalities.training import RunSettings


@dataclass(kw_only=True)
class EagleConfig(RunSettings):
    run_dir: str = "runs/eagle"
    model: str = "code"  # 'code' (the shipped code target), 'gemma' or a model folder
    method: str = "eagle"  # 'poss': position specialists over an EAGLE head (modalities/drafters/poss.py); 'mtp':
    # FastMTP's module (modalities/drafters/mtp.py), with MTP_DEFAULTS unless given; 'falcon': Falcon's
    # semi-autoregressive head (modalities/drafters/falcon.py), with FALCON_DEFAULTS unless given
    base: str = ""  # poss: the EAGLE head it extends (default: the one trained for the target)
    specialists: int = 3  # poss: layers in all, the base's included (drafted position k >= 3 reads the last)
    windows: int = 1536
    window_len: int = 128
    prompt_len: int = 32  # of a greedily continued window
    eval_windows: int = 64  # per data kind
    vocab_size: int = 0  # 0: the target's whole vocabulary
    steps: int = 800
    batch_size: int = 16
    lr: float = 1e-3
    warmup: int = 50
    noise: float = 0.1
    feature_weight: float = 1.0
    law_weight: float = 0.1
    law_share: float = 0.25
    unroll: int = 1  # > 1: also train on the head's own predicted features, that many passes deep (poss: at
    # least one pass per specialist)
    block: int = 1  # falcon: tokens drafted per head forward (k); pairs see their whole block of k
    glance_start: float = 0.0  # falcon: glancing share at the first step (module docstring of the trainer) ...
    glance_end: float = 0.0  # ... and at the last, linearly in between
    depth_decay: float = 1.0  # depth d's loss weighs depth_decay ** (d - 1) (normalised): FastMTP's decaying weights
    sampled_prose: bool = False  # Gemma: the third data kind is docstring prompts continued by sampling (temperature
    # 1) instead of real docstrings, so every window's continuation is the target's own
    intermediate_size: int = 1024
    heads: int = 4
    kv_heads: int = 1
    data_threads: int = 2
    max_files: int = 0  # > 0: the first corpus files only (quick checks)
    eval_every: int = 200


# FastMTP (`--method mtp`): cross-entropy against the target's law only, three recursive steps with weights decaying
# by depth (0.6 per step: our choice, the paper's exact weights are not given in its code), no input noise, and
# self-distilled data only.
MTP_DEFAULTS = {"feature_weight": 0.0, "law_weight": 1.0, "noise": 0.0, "unroll": 3, "depth_decay": 0.6,
                "law_share": 0.5, "sampled_prose": True}

# Falcon (`--method falcon`): blocks of two tokens per head forward (the paper's k = 2), one pass on the target's
# features and one on the head's own predictions, glancing at the truth for a share of the second pass's blocks
# that starts at 0.6 and ends at 0.25 of the first pass's disagreement (our reading of the paper's annealed λ).
FALCON_DEFAULTS = {"block": 2, "unroll": 2, "glance_start": 0.6, "glance_end": 0.25}
METHOD_DEFAULTS = {"mtp": MTP_DEFAULTS, "falcon": FALCON_DEFAULTS}


def config_for(method: str, **given) -> EagleConfig:
    """The config of a run of `method`, its own defaults under the options given."""
    return EagleConfig(method=method, **{**METHOD_DEFAULTS.get(method, {}), **given})


def yes_no(text: str) -> bool:
    """A boolean option's value on the command line."""
    import argparse

    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
