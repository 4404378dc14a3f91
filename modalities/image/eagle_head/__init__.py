"""An EAGLE-style draft head over the image target's features (Li et al. 2024, EAGLE-1), the drafter of LANTERN
and LANTERN++: `head` (the module, its save/load) and `drafter` (static draft trees built with the head). Its
trainer (`specgen train image-head`) is `specgen.modalities.image.training.eagle_head`."""
