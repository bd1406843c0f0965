"""The reference backend: DDTree on Hugging Face `transformers` models (CPU or GPU, batch size 1)."""
