"""Training the image and video models, beside the image serving code.

- `images.py`         the offline 64×64 image data set (glyphs, digits, photos) with prompts and classes;
- `clips.py`          the offline video clips: a glyph moving across a still background;
- `tokenizer.py`      the VQ image tokenizer's training step (role vq);
- `token_models.py`   the image and video token models' training step (roles target, draft, video);
- `recipe.py`         the resumable loop and command line that run them (`specgen train image`);
- `card.py`           the model card's figures (PSNR, reconstructions, samples);
- `eagle_head.py`     the EAGLE-style draft head of LANTERN / LANTERN++ (`specgen train image-head`), on
                      `head_samples.py`: the target's own samples and features;
- `quality/`          the image classifier and Fréchet distance that measure sample quality
                      (`specgen train image-classifier`).
"""
