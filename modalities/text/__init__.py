"""Text modality: drafters, tokenizer handling and text models."""
