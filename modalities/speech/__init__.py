"""Speech tokens: acoustic tokenizer, vocoder, speech LM and PCG groups."""
