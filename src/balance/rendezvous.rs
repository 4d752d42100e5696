//! Rendezvous (highest-random-weight) hashing: a key goes to the backend whose NAME hashed with
//! the key weighs most. The hash is fixed and specified (XXH3 seeded by the key), so two
//! gateways with the same backends agree without talking, and a backend leaving moves only the
//! keys it had (every other backend's weight for a key is unchanged).

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// A session key (a header's value, `prompt_cache_key`, `user`) as a rendezvous key.
pub fn key_of(text: &str) -> u64 {
    xxh3_64_with_seed(text.as_bytes(), 0x7365_7373)
}

/// `name`'s weight for `key`.
pub fn weight(key: u64, name: &str) -> u64 {
    xxh3_64_with_seed(name.as_bytes(), key)
}

/// The position in `names` of the one `key` goes to (equal weights: the smaller name); `None`
/// when `names` is empty.
pub fn pick<'a>(key: u64, names: impl IntoIterator<Item = &'a str>) -> Option<usize> {
    names
        .into_iter()
        .enumerate()
        .max_by(|(_, a), (_, b)| weight(key, a).cmp(&weight(key, b)).then_with(|| b.cmp(a)))
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn keys_spread_over_backends() {
        let names = ["studio", "mini", "air"];
        let mut counts = [0usize; 3];
        for k in 0..3000u64 {
            counts[pick(key_of(&k.to_string()), names).expect("some")] += 1;
        }
        // Each gets its share, loosely: 1000 ± 200.
        assert!(counts.iter().all(|&c| (800..1200).contains(&c)), "{counts:?}");
    }

    #[test]
    fn nothing_to_pick_from() {
        assert_eq!(pick(1, []), None);
    }

    #[test]
    fn the_hash_is_fixed() {
        // Two gateways, any version: the same weight for the same name and key.
        assert_eq!(weight(42, "studio"), xxh3_64_with_seed(b"studio", 42));
        assert_eq!(key_of("abc"), key_of("abc"));
        assert_ne!(key_of("abc"), key_of("abd"));
    }

    proptest! {
        /// A backend leaving moves only its own keys; one joining takes keys only for itself.
        #[test]
        fn a_backend_leaving_moves_only_its_own_keys(
            names in proptest::collection::btree_set("[a-z]{1,8}", 2..6),
            leaving in any::<prop::sample::Index>(),
            keys in proptest::collection::vec(any::<u64>(), 1..200),
        ) {
            let all: Vec<&str> = names.iter().map(String::as_str).collect();
            let gone = all[leaving.index(all.len())];
            let rest: Vec<&str> = all.iter().copied().filter(|n| *n != gone).collect();
            for key in keys {
                let before = all[pick(key, all.iter().copied()).expect("some")];
                let after = rest[pick(key, rest.iter().copied()).expect("some")];
                if before != gone {
                    prop_assert_eq!(before, after, "key {} moved though its backend stayed", key);
                }
            }
        }

        /// The order the backends are listed in does not matter.
        #[test]
        fn order_does_not_matter(names in proptest::collection::btree_set("[a-z]{1,8}", 1..6), key in any::<u64>()) {
            let forward: Vec<&str> = names.iter().map(String::as_str).collect();
            let backward: Vec<&str> = forward.iter().rev().copied().collect();
            prop_assert_eq!(
                forward[pick(key, forward.iter().copied()).expect("some")],
                backward[pick(key, backward.iter().copied()).expect("some")]
            );
        }
    }
}
