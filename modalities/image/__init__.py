"""Image and video tokens: VQ tokenizers, visual AR models, SJD/MC-SJD, LANTERN++."""
