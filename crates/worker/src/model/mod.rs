//! Model loading, tokenizer and the forward pass over the KV pool.
