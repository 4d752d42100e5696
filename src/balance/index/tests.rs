use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;

/// A prompt of one message per label, each about `size` bytes.
fn prompt_sized(labels: &[u8], size: usize) -> Prompt {
    let messages: Vec<Value> = labels.iter().map(|l| json!({"c": format!("{l:03}").repeat(size / 3)})).collect();
    Prompt::of_chat(&serde_json::to_vec(&json!({"messages": messages})).expect("encodes"))
}

fn prompt(labels: &[u8]) -> Prompt {
    prompt_sized(labels, 300)
}

/// Observes an answer whose report says the server held `held` whole segments (tokens = bytes).
fn answer(index: &mut PrefixIndex, p: &Prompt, held: usize) -> Correction {
    let predicted = index.predict(p);
    index.observe(p, predicted, Some(p.bytes_of(held)), Some(p.bytes()))
}

#[test]
fn an_empty_index_predicts_nothing() {
    let index = PrefixIndex::new(10);
    assert_eq!(index.predict(&prompt(&[1, 2])).segments, 0);
    assert!(index.is_empty());
}

#[test]
fn a_served_prompt_is_held_and_its_next_turn_matches_it() {
    let mut index = PrefixIndex::new(10);
    let turn1 = prompt(&[1, 2]);
    index.observe(&turn1, Match::default(), None, None);
    let turn2 = prompt(&[1, 2, 3, 4]);
    let m = index.predict(&turn2);
    assert_eq!((m.segments, m.bytes), (2, turn1.bytes()));
    // Another conversation shares the first message only.
    assert_eq!(index.predict(&prompt(&[1, 9, 3])).segments, 1);
}

#[test]
fn one_conversation_takes_one_place() {
    let mut index = PrefixIndex::new(10);
    for turn in 1..=5u8 {
        let labels: Vec<u8> = (0..turn * 2).collect();
        index.insert(&prompt(&labels));
    }
    assert_eq!(index.len(), 1, "each turn extends the one before: its prefix goes");
    // The same prompt again: still one.
    index.insert(&prompt(&(0..10).collect::<Vec<u8>>()));
    assert_eq!(index.len(), 1);
    // A shorter prompt of it is a new sequence (the server keeps both).
    index.insert(&prompt(&[0, 1]));
    assert_eq!(index.len(), 2);
}

#[test]
fn the_least_recently_served_goes_first() {
    let mut index = PrefixIndex::new(2);
    index.insert(&prompt(&[1]));
    index.insert(&prompt(&[2]));
    index.insert(&prompt(&[1])); // served again: newest
    index.insert(&prompt(&[3]));
    assert_eq!(index.predict(&prompt(&[2])).segments, 0, "2 was the oldest");
    assert_eq!(index.predict(&prompt(&[1])).segments, 1);
    assert_eq!(index.predict(&prompt(&[3])).segments, 1);
}

#[test]
fn a_report_below_the_prediction_drops_what_the_server_no_longer_holds() {
    let mut index = PrefixIndex::new(10);
    index.insert(&prompt(&[1, 2, 3, 4]));
    index.insert(&prompt(&[1, 7]));
    // Another conversation sharing two messages with the first.
    let next = prompt(&[1, 2, 5]);
    assert_eq!(index.predict(&next).segments, 2);
    // The server had evicted [1,2,3,4]: it holds only the first message ([1,7]'s).
    let c = answer(&mut index, &next, 1);
    assert_eq!(c.reported_segments, Some(1));
    assert_eq!(c.dropped, 1);
    assert_eq!(index.predict(&prompt(&[1, 2, 3, 4, 9])).segments, 2, "[1,2,3,4] is gone: only [1,2,5] shares");
    assert_eq!(index.predict(&next).segments, 3, "the prompt just served is held now");
    // An LRU that evicted [1,2,3,4] with one newer sequence kept one: [1,7] is a ghost now
    // (predicted from no more) until a report shows the server holds it.
    assert_eq!(index.learnt_capacity(), 1);
    assert_eq!(index.predict(&prompt(&[1, 7, 9])).segments, 1, "[1,7] not predicted past what all share");
    answer(&mut index, &prompt(&[1, 7, 9]), 2);
    assert_eq!(index.learnt_capacity(), 2, "[1,7] was held: the server keeps two");
}

#[test]
fn a_report_near_the_prediction_changes_nothing_but_the_insertion() {
    let mut index = PrefixIndex::new(10);
    index.insert(&prompt(&[1, 2, 3, 4]));
    let next = prompt(&[1, 2, 3, 4, 5]);
    // mlx_lm.server holds one token back, and tokens do not spread evenly over bytes.
    let predicted = index.predict(&next);
    let c = index.observe(&next, predicted, Some(next.bytes_of(4) * 9 / 10), Some(next.bytes()));
    assert_eq!(c.dropped, 0);
    assert!(c.reported_segments.expect("reported") >= 4);
}

#[test]
fn a_server_that_reports_nothing_leaves_the_guess() {
    let mut index = PrefixIndex::new(10);
    index.insert(&prompt(&[1, 2, 3]));
    let next = prompt(&[1, 2, 3, 4]);
    let c = index.observe(&next, index.predict(&next), None, Some(next.bytes()));
    assert_eq!(c, Correction { reported_segments: None, dropped: 0 });
    assert_eq!(index.len(), 1, "the extension replaced its prefix");
}

#[test]
fn a_sequence_inserted_after_the_plan_is_not_judged_by_its_report() {
    let mut index = PrefixIndex::new(10);
    let p = prompt(&[1, 2, 3]);
    let planned = index.predict(&p); // nothing held yet
    // Meanwhile another request of the same conversation ended on this backend.
    index.insert(&prompt(&[1, 2, 3, 4]));
    // This one's report (its prefill ran before that insertion) says nothing was held.
    let c = index.observe(&p, planned, Some(0), Some(p.bytes()));
    assert_eq!(c.dropped, 0);
    assert_eq!(index.predict(&prompt(&[1, 2, 3, 4, 5])).segments, 4);
}

#[test]
fn clear_forgets_everything() {
    let mut index = PrefixIndex::new(10);
    index.insert(&prompt(&[1, 2]));
    index.clear();
    assert!(index.is_empty());
    assert_eq!(index.predict(&prompt(&[1, 2])).segments, 0);
}

#[test]
fn capacity_is_bounded() {
    assert_eq!(PrefixIndex::new(0).capacity, 1);
    assert_eq!(PrefixIndex::new(usize::MAX).capacity, MAX_CAPACITY);
    let mut index = PrefixIndex::new(3);
    for i in 0..20 {
        index.insert(&prompt(&[i]));
    }
    assert_eq!(index.len(), 3);
}

/// A server's cache as the index models it (mlx_lm.server's rules on whole segments): an LRU
/// of at most `capacity` sequences; a prompt's cached part is the longest prefix a stored one
/// shares; serving inserts the prompt at the front and drops its stored prefixes.
struct Server {
    capacity: usize,
    stored: Vec<Vec<u8>>,
}

impl Server {
    fn cached(&self, labels: &[u8]) -> usize {
        self.stored.iter().map(|s| s.iter().zip(labels).take_while(|(a, b)| a == b).count()).max().unwrap_or(0)
    }

    fn serve(&mut self, labels: &[u8]) {
        self.stored.retain(|s| !(s.len() <= labels.len() && labels[..s.len()] == s[..]));
        self.stored.insert(0, labels.to_vec());
        self.stored.truncate(self.capacity);
    }
}

/// Conversations growing turn by turn, interleaved, with a restart now and then.
fn schedule() -> impl Strategy<Value = Vec<(usize, bool)>> {
    proptest::collection::vec((0usize..8, proptest::bool::weighted(0.03)), 1..120)
}

proptest! {
    /// Index and server fed the same requests: with the server's own capacity, the index
    /// predicts exactly what the server reports; with a larger one (the server holds fewer
    /// than the gateway was told), it never predicts less, and right after a report below its
    /// prediction, the correction alone brings the prediction down to exactly the report.
    #[test]
    fn self_correction_converges_on_what_the_server_holds(
        server_capacity in 1usize..6,
        extra in 0usize..4,
        turns in schedule(),
    ) {
        let mut server = Server { capacity: server_capacity, stored: Vec::new() };
        let mut index = PrefixIndex::new(server_capacity + extra);
        let mut conversations: Vec<Vec<u8>> = (0..8u8).map(|c| vec![200, c]).collect();
        for (c, restart) in turns {
            if restart {
                server.stored.clear();
                index.clear();
            }
            let labels = &mut conversations[c];
            labels.extend([labels.len() as u8, 100 + c as u8]);
            let p = prompt_sized(labels, 30);
            let predicted = index.predict(&p);
            let held = server.cached(labels);
            prop_assert!(predicted.segments >= held, "under-predicted: {} < {}", predicted.segments, held);
            if extra == 0 {
                prop_assert_eq!(predicted.segments, held);
            }
            prop_assert!(predicted.segments <= p.segments() && predicted.bytes <= p.bytes());
            index.correct(&p, held, predicted.clock);
            prop_assert_eq!(index.predict(&p).segments, held, "the next prediction is the report");
            index.insert(&p);
            server.serve(labels);
            prop_assert!(index.len() <= server_capacity + extra);
        }
    }

    /// Index and server fed the same answers through `observe` (the reports as a server makes
    /// them), the gateway told `extra` sequences more than the server keeps: the index never
    /// believes the server keeps fewer than it does, and each report that proves a prediction
    /// wrong teaches it a smaller capacity, so at most `extra` do over a whole run.
    #[test]
    fn the_index_learns_how_many_sequences_the_server_keeps(
        server_capacity in 1usize..6,
        extra in 0usize..5,
        turns in schedule(),
    ) {
        let mut server = Server { capacity: server_capacity, stored: Vec::new() };
        let mut index = PrefixIndex::new(server_capacity + extra);
        let mut conversations: Vec<Vec<u8>> = (0..8u8).map(|c| vec![200, c]).collect();
        let mut proven_wrong = 0;
        for (c, restart) in turns {
            if restart {
                server.stored.clear();
                index.clear();
            }
            let labels = &mut conversations[c];
            labels.extend([labels.len() as u8, 100 + c as u8]);
            let p = prompt_sized(labels, 300);
            let held = server.cached(labels);
            let predicted = index.predict(&p).segments;
            let correction = answer(&mut index, &p, held);
            proven_wrong += usize::from(correction.reported_segments.is_some_and(|r| predicted > r));
            server.serve(labels);
            prop_assert!(index.learnt_capacity() >= server_capacity, "learnt {} < {}", index.learnt_capacity(), server_capacity);
        }
        prop_assert!(proven_wrong <= extra, "{proven_wrong} predictions proven wrong, {extra} extra");
    }

    /// A prediction never exceeds the prompt, whatever the index holds.
    #[test]
    fn a_prediction_never_exceeds_the_prompt(
        stored in proptest::collection::vec(proptest::collection::vec(0u8..3, 0..8), 0..12),
        asked in proptest::collection::vec(0u8..3, 0..8),
    ) {
        let mut index = PrefixIndex::new(10);
        for s in &stored {
            index.insert(&prompt_sized(s, 12));
        }
        let p = prompt_sized(&asked, 12);
        let m = index.predict(&p);
        prop_assert!(m.segments <= p.segments());
        prop_assert!(m.bytes <= p.bytes());
        prop_assert_eq!(m.bytes, p.bytes_of(m.segments));
    }
}

/// A chat prompt: `turns` (user, assistant) pairs, then a user message.
fn chat(turns: usize) -> Prompt {
    let mut messages = vec![json!({"role": "system", "content": "s".repeat(300)})];
    for t in 0..turns {
        messages.push(json!({"role": "user", "content": format!("question {t} ").repeat(20)}));
        messages.push(json!({"role": "assistant", "content": format!("answer {t} ").repeat(40)}));
    }
    messages.push(json!({"role": "user", "content": format!("question {turns} ").repeat(20)}));
    Prompt::of_chat(&serde_json::to_vec(&json!({"messages": messages})).expect("encodes"))
}

#[test]
fn the_answer_after_a_stored_prompt_is_expected_at_the_learnt_fraction() {
    let mut index = PrefixIndex::new(10);
    let first = chat(0); // system, user
    index.insert(&first);
    let second = chat(1); // system, user, assistant (the answer to `first`), user
    let m = index.predict(&second);
    assert_eq!(m.segments, 2);
    assert_eq!(m.answer_bytes, second.bytes_of(3) - second.bytes_of(2));
    assert_eq!(m.expected_bytes, m.bytes + m.answer_bytes / 2, "the prior: half");
    // The server reports the whole answer held (a template that renders it as generated).
    for _ in 0..30 {
        let m = index.predict(&second);
        let reported = m.bytes + m.answer_bytes;
        index.observe(&second, m, Some(reported), Some(second.bytes()));
        index.clear();
        index.insert(&first);
    }
    assert!(index.answers_held() > 0.99, "{}", index.answers_held());
    // A stored prompt matched only in part has no answer after it.
    index.insert(&chat(3));
    let m = index.predict(&chat(2));
    assert_eq!(m.answer_bytes, 0);
}

#[test]
fn an_answer_rendered_anew_teaches_that_none_of_it_is_held() {
    let mut index = PrefixIndex::new(10);
    let (first, second) = (chat(0), chat(1));
    for _ in 0..30 {
        index.clear();
        index.insert(&first);
        let m = index.predict(&second);
        // A template that strips reasoning: the cache stops where the answer begins.
        let c = index.observe(&second, m, Some(m.bytes), Some(second.bytes()));
        assert_eq!(c.dropped, 0, "the prompt before the answer is held: nothing to drop");
    }
    assert!(index.answers_held() < 0.01, "{}", index.answers_held());
    index.clear();
    index.insert(&first);
    let m = index.predict(&second);
    assert_eq!(m.expected_bytes, m.bytes);
}

#[test]
fn a_server_keeping_fewer_sequences_is_learnt_and_one_keeping_more_grows_it_back() {
    let mut index = PrefixIndex::new(10);
    for c in 1..=4u8 {
        index.insert(&prompt(&[c, c]));
    }
    // The server kept only the two newest ([4,4], [3,3]): [2,2]'s next turn finds nothing.
    let c = answer(&mut index, &prompt(&[2, 2, 9]), 0);
    assert_eq!(c.dropped, 1);
    assert_eq!(index.learnt_capacity(), 2, "proven gone with two newer before it");
    // Now [2,2,9], [4,4], [3,3], [1,1]: predictions look at the two newest only.
    assert_eq!(index.len(), 2);
    assert_eq!(index.predict(&prompt(&[3, 3, 5])).segments, 0, "[3,3] is a ghost now");
    // But the server had kept [3,3] after all (it keeps three): the report grows it back.
    answer(&mut index, &prompt(&[3, 3, 5]), 2);
    assert_eq!(index.learnt_capacity(), 3);
    // A restart empties it but keeps what was learnt.
    index.clear();
    assert_eq!((index.len(), index.learnt_capacity()), (0, 3));
}

/// Two real servers keeping 2 sequences, several conversations each: every report was the
/// shared opening alone. Each report proves the conversation's earlier turn gone, the believed
/// capacity falls to what the server keeps, and a report within the prediction's tolerance
/// proves no ghost held (only one beyond it does), so it stays there.
#[test]
fn a_server_that_keeps_no_earlier_turn_is_predicted_to_give_the_opening_alone() {
    // A long shared opening (tools, system prompt), then each conversation's messages.
    let conv = |c: u8, turns: u8| {
        let mut messages = vec![json!({"c": "s".repeat(300)})];
        messages.extend((0..=turns).map(|t| json!({"c": format!("{c:02}{t:02}").repeat(10)})));
        Prompt::of_chat(&serde_json::to_vec(&json!({"messages": messages})).expect("encodes"))
    };
    let mut index = PrefixIndex::new(10);
    for c in 1..=4 {
        index.insert(&conv(c, 4));
    }
    let mut wrong = Vec::new();
    for turn in 5..9 {
        for c in 1..=4 {
            let p = conv(c, turn);
            let predicted = index.predict(&p);
            if predicted.segments != 1 {
                wrong.push((turn, c, predicted.segments));
            }
            index.observe(&p, predicted, Some(p.bytes_of(1)), Some(p.bytes()));
        }
    }
    // Four conversations in turn: the three newest sequences are always the others'. The first
    // report proves the server keeps at most three, and no prediction is wrong after it.
    assert!(index.learnt_capacity() <= 3, "learnt {}", index.learnt_capacity());
    assert_eq!(wrong, [(5, 1, 6)], "predictions beyond the opening (turn, conversation, segments)");
}
