"""Data: benchmark loaders (formats), JSONL helpers (jsonl), the retrieval corpus (corpus)."""
