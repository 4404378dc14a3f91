"""The modality-agnostic draft-verify core (torch only; never transformers, diffusers, torchaudio or gradio).

Submodules, one concept each: `types` (Draft, DraftTree, Verdict, StepEvent), `protocols`, `processing`
(the one processed distribution), `noise` (counter-based randomness), `acceptance` (rules), `groups` (token
groups for rules exact in groups) and `group_acceptance` (the relaxed rules PCG and SSD), `tree`,
`policies` (draft length), `stats`, `loop` (`speculative_generate`), `registry` (method table).
Import the submodule you need; this package's top level stays free of torch so the CLI starts fast.
"""
