"""Training the speech models, beside the speech serving code.

- `spoken_corpus.py`  the offline corpus: sentences spoken by espeak-ng's and flite's voices;
- `codebook.py`       the acoustic codebook (k-means over log-mel frames) and the corpus encoded with it;
- `alignment.py`      character or phoneme durations, by Viterbi training on the corpus' own frames;
- `token_models.py`   the target and draft token models (`specgen train speech`), with DistillSpec's forward KL
                      for a distilled draft and input noise against exposure bias;
- `recipe.py`         the command line that runs each of them (`--role codec | tokens | target | draft`);
- `evaluate.py`       the model card's figures: resynthesis ceiling, word error rates, generated speech;
- `quality.py`        a speaker-similarity proxy, the token-swap stress test and bootstrap intervals.
"""
