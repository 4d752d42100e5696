//! Cutting text at token boundaries: the middle of a text cut around [`CUT_MARKER`], and cuts
//! moved by a few tokens to where the text splits cleanly (a byte-level BPE token may hold half
//! a character).

use std::ops::RangeInclusive;

use crate::tokens::Count;

/// The marker put where the middle of a text was cut.
pub const CUT_MARKER: &str = "\n…\n";
/// How many tokens a cut may move to land on a character boundary.
pub(super) const MAX_BOUNDARY_SHIFT: usize = 4;

/// The end of a piece starting at `start` of at most `len` tokens (at least one).
pub(super) fn piece_end(counter: &dyn Count, ids: &[u32], start: usize, len: usize) -> usize {
    let end = (start + len.max(1)).min(ids.len());
    if end == ids.len() { end } else { clean_boundary(counter, ids, end, start + 1) }
}

/// The text of `ids` keeping about `keep` tokens, head and tail, around [`CUT_MARKER`], and
/// how many tokens it kept.
pub(super) fn cut_middle(counter: &dyn Count, ids: &[u32], keep: usize) -> (String, usize) {
    if keep >= ids.len() {
        return (counter.decode(ids), ids.len());
    }
    let head = clean_boundary(counter, ids, keep / 2, 0);
    let tail_start = clean_boundary_forward(counter, ids, ids.len() - (keep - keep / 2));
    let text = format!("{}{CUT_MARKER}{}", counter.decode(&ids[..head]), counter.decode(&ids[tail_start..]));
    (text, head + ids.len() - tail_start)
}

/// `at`, or up to [`MAX_BOUNDARY_SHIFT`] tokens before it (not below `floor`), where the text
/// splits cleanly: decoding both sides apart gives the same text as decoding them together (a
/// byte-level BPE token may hold half a character).
pub(super) fn clean_boundary(counter: &dyn Count, ids: &[u32], at: usize, floor: usize) -> usize {
    clean_within(counter, ids, at, floor..=at)
}

/// The clean boundary nearest `at` within `allowed` (at most [`MAX_BOUNDARY_SHIFT`] away,
/// earlier first on a tie); `at` when there is none.
pub(super) fn clean_within(counter: &dyn Count, ids: &[u32], at: usize, allowed: RangeInclusive<usize>) -> usize {
    (0..=MAX_BOUNDARY_SHIFT)
        .flat_map(|shift| [at.checked_sub(shift), at.checked_add(shift)])
        .flatten()
        .filter(|b| allowed.contains(b))
        .find(|b| splits_cleanly(counter, ids, *b))
        .unwrap_or(at)
}

/// Like [`clean_boundary`], moving forward.
pub(super) fn clean_boundary_forward(counter: &dyn Count, ids: &[u32], at: usize) -> usize {
    (0..=MAX_BOUNDARY_SHIFT)
        .map(|shift| at + shift)
        .take_while(|b| *b <= ids.len())
        .find(|b| splits_cleanly(counter, ids, *b))
        .unwrap_or(at)
}

fn splits_cleanly(counter: &dyn Count, ids: &[u32], at: usize) -> bool {
    if at == 0 || at >= ids.len() {
        return true;
    }
    let window = at.saturating_sub(MAX_BOUNDARY_SHIFT)..(at + MAX_BOUNDARY_SHIFT).min(ids.len());
    let apart = counter.decode(&ids[window.start..at]) + &counter.decode(&ids[at..window.end]);
    apart == counter.decode(&ids[window])
}
