"""The modality-agnostic draft-verify core (torch only; never transformers, diffusers, torchaudio or gradio).

Submodules, one concept each: `types` (Draft, DraftTree, Verdict, StepEvent), `protocols`, `processing`
(the one processed distribution), `noise` (counter-based randomness), `acceptance` (rules), `groups` (token
groups for rules exact in groups) and `group_acceptance` (the relaxed rules PCG and SSD), `trees` (tree shapes,
Sequoia's program, tree construction and verification), `jacobi` (SJD, MC-SJD, Gumbel coupling), `lantern`
(LANTERN / LANTERN++ relaxed tree verification), `guided` (batched classifier-free guidance),
`length_policies` (fixed, heuristic, SVIP, Kangaroo-style confidence, the cost model), `tetris` (which drafted
tokens a batch verifies under a capacity), `stats`,
`loop` (`speculative_generate`), `registry` (method table and default methods); the verification kit: `toy`
(table models), `oracle` (exact enumeration), `chisquare`, `selfcheck`.
Import the submodule you need; this package's top level stays free of torch so the CLI starts fast.
"""
