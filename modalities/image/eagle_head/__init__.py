"""An EAGLE-style draft head over the image target's features (Li et al. 2024, EAGLE-1), the drafter of LANTERN
and LANTERN++: `head` (the module, its save/load), `data` (target samples and features), `train` (the resumable
trainer, `specgen train image-head`), `drafter` (static draft trees built with the head)."""
