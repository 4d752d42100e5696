//! The model's own tokenizer and chat template (to be written).
