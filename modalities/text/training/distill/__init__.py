"""Training drafts to agree with their target (acceptance = Σ min(target, draft) = 1 − TV).

Where each paper's idea lives:
- `divergences.py`  DistillSpec's divergences (forward/reverse KL, JSD(β), TVD) over compact teacher
                    distributions, and AdaSPEC's selective token filter (S4);
- `teacher.py`      the target's distributions cached as top-k log-probabilities + tail mass, optionally
                    restricted to a reduced draft vocabulary (FR-Spec / FastMTP's vocabulary compression, S13);
- `windows.py`      training windows: a fixed corpus, the target's own generations, on-policy draft samples;
- `distiller.py`    `specgen train draft`: the resumable distillation loop;
- `export.py`       the exported draft and its model card;
- `prune.py`        pruned self-drafts: drop the target's block of least angular distance (S8);
- `online.py`       online speculative decoding: update the draft from its own rejections while serving (S6);
- `agreement.py`    α teacher-forced and from real speculative runs;
- `experiments.py`  the recorded comparisons in `benchmarks/distill-*`.
"""
