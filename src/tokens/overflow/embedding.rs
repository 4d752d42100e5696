//! Embedding inputs over the cap: split into pieces that each fit ([`split_for_embedding`]),
//! and the pieces' vectors averaged back into one ([`average_embeddings`]).

use super::cut::piece_end;
use crate::tokens::Count;

/// Splits an embedding input into pieces at token boundaries, each fitting `cap` as the server
/// counts it (special tokens included), without overlap. Returns each piece's text with its
/// token count (tokens of the text, no special tokens: the weights for
/// [`average_embeddings`]). A text that fits is returned whole; a cap no larger than the
/// special tokens gives one-token pieces (nothing can fit).
pub fn split_for_embedding(counter: &dyn Count, text: &str, cap: usize) -> Vec<(String, usize)> {
    let ids = counter.encode(text);
    let special = counter.text_tokens(text).saturating_sub(ids.len());
    if ids.len() + special <= cap {
        return vec![(text.to_string(), ids.len())];
    }
    let mut pieces = Vec::new();
    let mut start = 0;
    while start < ids.len() {
        let mut len = cap.saturating_sub(special).max(1);
        loop {
            let end = piece_end(counter, &ids, start, len);
            let piece = counter.decode(&ids[start..end]);
            let over = counter.text_tokens(&piece).saturating_sub(cap);
            if over == 0 || end - start == 1 {
                pieces.push((piece, end - start));
                start = end;
                break;
            }
            len = (end - start).saturating_sub(over).max(1);
        }
    }
    pieces
}

/// The embedding of a split input: the mean of its pieces' vectors weighted by their tokens
/// (equal weights when every weight is 0). When every piece is unit length (OpenAI-style
/// embeddings are) the mean is re-normalised to unit length, so it stays comparable by dot
/// product; otherwise it is the plain weighted mean. All vectors come from one model and have
/// one length; an empty input gives an empty vector.
pub fn average_embeddings(pieces: &[(Vec<f32>, usize)]) -> Vec<f32> {
    let Some((first, _)) = pieces.first() else {
        return Vec::new();
    };
    let total: usize = pieces.iter().map(|(_, tokens)| tokens).sum();
    let weight = |tokens: usize| {
        if total == 0 { 1.0 / pieces.len() as f64 } else { tokens as f64 / total as f64 }
    };
    let mut mean = vec![0f64; first.len()];
    for (vector, tokens) in pieces {
        for (sum, value) in mean.iter_mut().zip(vector) {
            *sum += f64::from(*value) * weight(*tokens);
        }
    }
    let all_unit = pieces.iter().all(|(vector, _)| (norm(vector.iter().map(|v| f64::from(*v))) - 1.0).abs() < 1e-3);
    let length = norm(mean.iter().copied());
    if all_unit && length > 0.0 {
        mean.iter_mut().for_each(|v| *v /= length);
    }
    mean.into_iter().map(|v| v as f32).collect()
}

fn norm(values: impl Iterator<Item = f64>) -> f64 {
    values.map(|v| v * v).sum::<f64>().sqrt()
}
