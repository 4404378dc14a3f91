"""The settings of `specgen train head --method eagle|poss` (modalities/text/training/eagle.py), apart from the
trainer so the command line reads them without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

from specgen.modalities.training import RunSettings


@dataclass(kw_only=True)
class EagleConfig(RunSettings):
    run_dir: str = "runs/eagle"
    model: str = "code"  # 'code' (the shipped code target), 'gemma' or a model folder
    method: str = "eagle"  # or 'poss': position specialists over an EAGLE head (modalities/drafters/poss.py)
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
    intermediate_size: int = 1024
    heads: int = 4
    kv_heads: int = 1
    data_threads: int = 2
    max_files: int = 0  # > 0: the first corpus files only (quick checks)
    eval_every: int = 200
