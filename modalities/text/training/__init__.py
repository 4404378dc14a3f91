"""Training the text models, beside the text serving code.

- `stdlib_corpus.py`  the Python standard library as a deterministic training corpus;
- `code_models.py`    the shipped code target and draft, trained from scratch on it (`specgen train text`);
- `code_card.py`      their model card and manifest entries;
- `distill/`          drafts distilled from their target (`specgen train draft`): DistillSpec, AdaSPEC, reduced
                      vocabularies, pruned self-drafts, online speculative decoding.
"""
