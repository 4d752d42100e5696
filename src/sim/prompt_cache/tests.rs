use super::*;
use proptest::prelude::*;

fn toks(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_string).collect()
}

fn cache(capacity: usize, stored: &[&str]) -> LruPromptCache {
    let mut c = LruPromptCache::new(capacity);
    for s in stored {
        c.insert(toks(s), Kind::Assistant);
    }
    c
}

#[test]
fn a_repeated_prompt_is_served_less_its_last_token() {
    // The server stored the prompt and what it generated; the same prompt again shares all of
    // it with that longer sequence, trimmed to the prompt less one token.
    let c = cache(10, &["s1 s2 u1 u2 g1 g2"]);
    assert_eq!(c.fetch(&toks("s1 s2 u1 u2")), Found { cached: 3, shared: 4 });
}

#[test]
fn a_growing_conversation_is_served_its_stored_prefix_whole() {
    let c = cache(10, &["s1 u1 g1 g2"]);
    // The next turn repeats the answer as generated: the stored sequence is a prefix.
    assert_eq!(c.fetch(&toks("s1 u1 g1 g2 u2 u3")).cached, 4);
    // The next turn carries another answer (a replayed one): the shared prefix only.
    assert_eq!(c.fetch(&toks("s1 u1 a1 a2 u2")).cached, 2);
    // An unrelated prompt: nothing.
    assert_eq!(c.fetch(&toks("x y z")), Found { cached: 0, shared: 0 });
}

#[test]
fn an_exact_match_is_served_whole() {
    let c = cache(10, &["a b c"]);
    assert_eq!(c.fetch(&toks("a b c")).cached, 3);
}

#[test]
fn a_longer_sibling_sharing_more_beats_a_stored_prefix() {
    let mut c = cache(10, &["a b c x y"]);
    c.insert(toks("a b"), Kind::System);
    assert_eq!(c.fetch(&toks("a b c d")).cached, 3, "trimmed sibling: 3 shared");
    let c = cache(10, &["a b c", "a x"]);
    assert_eq!(c.fetch(&toks("a b c d e")).cached, 3, "the prefix, whole");
    // A stored prefix of one token does not count as a prefix (mlx_lm's `last_index > 0`), but
    // the walk still shares it: min(prompt − 1, 1).
    let c = cache(10, &["a"]);
    assert_eq!(c.fetch(&toks("a b")).cached, 1);
}

#[test]
fn inserting_drops_the_stored_prefixes_of_the_new_sequence() {
    let mut c = cache(10, &["a b", "a", "x y"]);
    c.insert(toks("a b c"), Kind::Assistant);
    let left: Vec<String> = c.sequences().iter().map(|(_, s)| s.join(" ")).collect();
    assert_eq!(left, vec!["x y", "a b c"]);
}

#[test]
fn eviction_is_by_insertion_and_a_lookup_does_not_refresh() {
    let mut c = cache(2, &["a 1", "b 1"]);
    assert_eq!(c.fetch(&toks("a 1 more")).cached, 2);
    c.insert(toks("c 1"), Kind::Assistant);
    let left: Vec<String> = c.sequences().iter().map(|(_, s)| s.join(" ")).collect();
    assert_eq!(left, vec!["b 1", "c 1"], "the oldest insertion goes, looked up or not");
    // Inserting the same tokens again moves them to the back.
    c.insert(toks("b 1"), Kind::Assistant);
    c.insert(toks("d 1"), Kind::Assistant);
    let left: Vec<String> = c.sequences().iter().map(|(_, s)| s.join(" ")).collect();
    assert_eq!(left, vec!["b 1", "d 1"]);
}

#[test]
fn system_checkpoints_are_evicted_last() {
    let mut c = LruPromptCache::new(2);
    c.insert(toks("sys"), Kind::System);
    c.insert(toks("a 1"), Kind::Assistant);
    c.insert(toks("b 1"), Kind::Assistant);
    c.insert(toks("c 1"), Kind::Assistant);
    let kinds: Vec<(Kind, String)> = c.sequences().iter().map(|(k, s)| (*k, s.join(" "))).collect();
    assert_eq!(kinds, vec![(Kind::Assistant, "c 1".into()), (Kind::System, "sys".into())]);
    // Only system sequences: the oldest of them goes.
    let mut c = LruPromptCache::new(1);
    c.insert(toks("s1"), Kind::System);
    c.insert(toks("s2"), Kind::System);
    assert_eq!(c.sequences(), vec![(Kind::System, &toks("s2")[..])]);
}

#[test]
fn capacity_zero_keeps_nothing_and_clear_empties() {
    let mut c = LruPromptCache::new(0);
    c.insert(toks("a b"), Kind::Assistant);
    assert!(c.is_empty());
    assert_eq!(c.fetch(&toks("a b c")).cached, 0);
    let mut c = cache(3, &["a b", "c d"]);
    assert_eq!(c.len(), 2);
    c.clear();
    assert_eq!((c.len(), c.capacity()), (0, 3));
}

proptest! {
    /// Whatever was stored: the cached count never exceeds the prompt, never exceeds the longest
    /// shared prefix, is less than the prompt unless a stored sequence equals it, and the cache
    /// never holds more than its capacity.
    #[test]
    fn counts_stay_within_the_prompt_and_the_capacity(
        stored in proptest::collection::vec(proptest::collection::vec(0u8..3, 0..6), 0..8),
        prompt in proptest::collection::vec(0u8..3, 0..6),
        capacity in 0usize..4,
    ) {
        let t = |v: &Vec<u8>| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let mut c = LruPromptCache::new(capacity);
        for s in &stored {
            c.insert(t(s), Kind::Assistant);
            prop_assert!(c.len() <= capacity);
        }
        let p = t(&prompt);
        let found = c.fetch(&p);
        prop_assert!(found.cached <= p.len());
        prop_assert!(found.cached <= found.shared);
        let exact = c.sequences().iter().any(|(_, s)| *s == p.as_slice());
        prop_assert!(exact || p.is_empty() || found.cached < p.len());
    }
}

#[test]
fn the_simulators_cache_reports_in_each_style_and_counts() {
    let mut lru = SimCache::new(Some(10));
    assert_eq!(lru.lookup(&toks("a b c"), PromptCache::LessLastToken), (Some(0), 0));
    lru.remember(stored_sequence(toks("a b c"), "t0 t1 "), Kind::Assistant);
    assert_eq!(lru.lookup(&toks("a b c"), PromptCache::LessLastToken), (Some(2), 2));
    assert_eq!(lru.lookup(&toks("a b c"), PromptCache::Whole), (Some(3), 3));
    assert_eq!(lru.lookup(&toks("a b c"), PromptCache::Unreported), (None, 2), "unreported, still spared");
    assert_eq!(lru.stats(), serde_json::json!({"size": 10, "sequences": 1, "lookups": 4, "hits": 3}));
    lru.reset();
    assert_eq!(lru.stats()["sequences"], 0);
    // The previous prompt alone: replaced at each lookup, nothing remembered.
    let mut previous = SimCache::new(None);
    previous.lookup(&toks("a b c"), PromptCache::LessLastToken);
    previous.remember(toks("x y"), Kind::Assistant);
    assert_eq!(previous.lookup(&toks("a b c d"), PromptCache::LessLastToken), (Some(3), 3));
    assert_eq!(previous.lookup(&toks("a b c d"), PromptCache::LessLastToken), (Some(3), 3));
    assert_eq!(previous.stats()["size"], serde_json::Value::Null);
}

#[test]
fn what_is_stored_and_checkpointed() {
    assert_eq!(stored_sequence(toks("p q"), "t0 t1 t2 "), toks("p q t0 t1 t2"), "every generated token");
    assert_eq!(stored_sequence(toks("p q"), ""), toks("p q"));
    let prompt = toks("s1 s2 u1");
    assert_eq!(system_checkpoint(&prompt, 2, 0), Some(toks("s1 s2")));
    assert_eq!(system_checkpoint(&prompt, 2, 2), None, "already served from the cache");
    assert_eq!(system_checkpoint(&prompt, 3, 0), None, "the whole prompt");
    assert_eq!(system_checkpoint(&prompt, 0, 0), None, "no system message");
}
