"""Other people's formats: Hugging Face BERT checkpoints in (hf_import) and out (hf_export)."""
