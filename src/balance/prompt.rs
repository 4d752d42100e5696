//! A prompt as the balancer sees it: a list of segments — the outgoing body's `tools` (one
//! segment), then each element of `messages`; a completions `prompt` string in
//! [`TEXT_PIECE`]-byte pieces — each read as a *canonical* hash, chained (the hash at `i`
//! includes every segment before it, so equal chained hashes at `i` mean equal prefixes up to
//! `i`), with each segment's cumulative size in bytes.
//!
//! Canonical: a segment's hash is that of its JSON value, not of its text — whitespace, the
//! order of an object's keys and string escapes (`\u00e9` or `é`) do not change it, and
//! `cache_control` members (Anthropic's cache marks, which clients move from turn to turn and
//! no chat template renders) are left out. The server's prompt cache holds rendered tokens, and
//! a chat template renders a message from its fields, not from its bytes: two turns that carry
//! the same message must give the same segment even when a client re-encodes it differently.
//! A size is the decoded text's length plus a few bytes per value (what a tokenizer reads);
//! only ratios of sizes are used, against learnt tokens per byte.
//!
//! One pass over the body (a serde visitor: no `Value` tree, no copy of the text but the
//! decoding of escaped strings), with a fixed, specified hash (XXH3) so that two gateways —
//! any version — read the same prompt alike.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// At most this many segments of a prompt are hashed (the first ones: a prefix is what a
/// cache holds); the rest count in its size only.
pub const MAX_SEGMENTS: usize = 4096;

/// A completions `prompt` string is cut into pieces of this many bytes.
pub const TEXT_PIECE: usize = 256;

// Seeds that keep the hashes of different kinds of values apart.
const NULL: u64 = 0x6e75_6c6c;
const FALSE: u64 = 0x6661_6c73;
const TRUE: u64 = 0x7472_7565;
const UNSIGNED: u64 = 0x7536_3420;
const SIGNED: u64 = 0x6936_3420;
const FLOAT: u64 = 0x6636_3420;
const STRING: u64 = 0x7374_7220;
const ARRAY: u64 = 0x6172_7220;
const OBJECT: u64 = 0x6f62_6a20;
const MEMBER: u64 = 0x6d65_6d20;
const CHAIN: u64 = 0x6368_6169;
const PIECE: u64 = 0x7069_6563;

/// A prompt's chained segment hashes and sizes (see the module's header).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prompt {
    /// `chain[i]`: the hash of segments `0..=i`.
    chain: Vec<u64>,
    /// `ends[i]`: the size in bytes of segments `0..=i`.
    ends: Vec<u64>,
    /// The whole prompt's size, segments past [`MAX_SEGMENTS`] included.
    bytes: u64,
    /// See [`Prompt::conversation_key`].
    conversation: u64,
    /// See [`Prompt::opening_segments`].
    opening: usize,
    /// `assistant[i]`: segment `i` is an assistant message (an answer the client sends back).
    assistant: Vec<bool>,
}

impl Prompt {
    /// The prompt of an outgoing request body: `tools` then `messages` (chat), or `prompt`
    /// (completions; a string in [`TEXT_PIECE`]-byte pieces, any other value one segment).
    /// A body that is not a JSON object gives the empty prompt (no cache is then predicted).
    pub fn of_chat(body: &[u8]) -> Prompt {
        let mut de = serde_json::Deserializer::from_slice(body);
        match de.deserialize_map(BodyVisitor) {
            Ok(read) => read.into_prompt(),
            Err(_) => Prompt::default(),
        }
    }

    /// The prompt of a plain text, in [`TEXT_PIECE`]-byte pieces.
    pub fn of_text(text: &str) -> Prompt {
        let read = Read { text: pieces(text), ..Read::default() };
        read.into_prompt()
    }

    /// How many segments are hashed.
    pub fn segments(&self) -> usize {
        self.chain.len()
    }

    /// The whole prompt's size in bytes (see the module's header).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The chained hashes, one per segment.
    pub fn chain(&self) -> &[u64] {
        &self.chain
    }

    /// The size of the first `segments` segments (`segments` ≤ [`Prompt::segments`]).
    pub fn bytes_of(&self, segments: usize) -> u64 {
        match segments.min(self.ends.len()) {
            0 => 0,
            n => self.ends[n - 1],
        }
    }

    /// How many whole segments fit in `bytes`.
    pub fn segments_within(&self, bytes: f64) -> usize {
        self.ends.partition_point(|&end| end as f64 <= bytes)
    }

    /// The conversation this prompt belongs to: the chained hash of every segment before the
    /// first `assistant` message (the tools, system prompt and user turn(s) that opened it —
    /// the same on every later turn), for rendezvous. A completions prompt: its first two
    /// pieces. 0 for the empty prompt.
    pub fn conversation_key(&self) -> u64 {
        self.conversation
    }

    /// Whether segment `i` is an assistant message.
    pub fn is_assistant(&self, i: usize) -> bool {
        self.assistant.get(i).copied().unwrap_or(false)
    }

    /// How many segments the conversation key covers: a backend holding fewer of them holds
    /// only what conversations share (tools, system prompt), not this conversation.
    pub fn opening_segments(&self) -> usize {
        self.opening
    }
}

/// A value read canonically.
#[derive(Debug, Clone, Copy, Default)]
struct Canon {
    hash: u64,
    size: u64,
    /// A message object whose own `role` is `"assistant"`.
    assistant: bool,
}

/// What the body visitor gathers.
#[derive(Default)]
struct Read {
    tools: Option<Canon>,
    messages: Vec<Canon>,
    /// Past [`MAX_SEGMENTS`]: counted, not kept.
    messages_size: u64,
    text: Vec<Canon>,
}

impl Read {
    fn into_prompt(self) -> Prompt {
        let opening = self.tools.is_some() as usize
            + self.messages.iter().position(|m| m.assistant).unwrap_or(self.messages.len());
        let segments: Vec<Canon> = self.tools.into_iter().chain(self.messages).chain(self.text).collect();
        let opening = if opening == 0 { segments.len().min(2) } else { opening };
        let mut chain = Vec::with_capacity(segments.len().min(MAX_SEGMENTS));
        let mut ends = Vec::with_capacity(chain.capacity());
        let mut assistant = Vec::with_capacity(chain.capacity());
        let mut hash = CHAIN;
        let mut bytes = 0u64;
        for (i, segment) in segments.iter().enumerate() {
            bytes += segment.size;
            if i < MAX_SEGMENTS {
                hash = xxh3_64_with_seed(&segment.hash.to_le_bytes(), hash);
                chain.push(hash);
                ends.push(bytes);
                assistant.push(segment.assistant);
            }
        }
        let opening = opening.min(chain.len());
        let conversation = match opening {
            0 => 0,
            n => chain[n - 1],
        };
        Prompt { chain, ends, bytes: bytes + self.messages_size, conversation, opening, assistant }
    }
}

fn pieces(text: &str) -> Vec<Canon> {
    text.as_bytes()
        .chunks(TEXT_PIECE)
        .map(|piece| Canon { hash: xxh3_64_with_seed(piece, PIECE), size: piece.len() as u64, assistant: false })
        .collect()
}

fn string(s: &str) -> Canon {
    Canon { hash: xxh3_64_with_seed(s.as_bytes(), STRING), size: s.len() as u64 + 2, assistant: false }
}

fn scalar(seed: u64, bits: u64) -> Canon {
    Canon { hash: xxh3_64_with_seed(&bits.to_le_bytes(), seed), size: 4, assistant: false }
}

/// Mixes `next` into `state` (order matters).
fn combine(state: u64, next: u64) -> u64 {
    xxh3_64_with_seed(&next.to_le_bytes(), state)
}

/// The top-level object of a request body.
struct BodyVisitor;

impl<'de> Visitor<'de> for BodyVisitor {
    type Value = Read;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a request body (an object)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Read, A::Error> {
        let mut read = Read::default();
        while let Some(key) = map.next_key_seed(KeySeed)? {
            match key.name {
                Name::Tools => read.tools = Some(map.next_value_seed(ValueSeed { role: false })?),
                Name::Messages => {
                    let (kept, size) = map.next_value_seed(MessagesSeed)?;
                    read.messages = kept;
                    read.messages_size = size;
                }
                Name::Prompt => read.text = map.next_value_seed(TextSeed)?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(read)
    }
}

/// The names the visitors look for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Name {
    Tools,
    Messages,
    Prompt,
    Role,
    CacheControl,
    Other,
}

/// An object's key, hashed as a string.
struct Key {
    canon: Canon,
    name: Name,
}

struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Key;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Key, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Key, E> {
        let name = match s {
            "tools" => Name::Tools,
            "messages" => Name::Messages,
            "prompt" => Name::Prompt,
            "role" => Name::Role,
            "cache_control" => Name::CacheControl,
            _ => Name::Other,
        };
        Ok(Key { canon: string(s), name })
    }
}

/// `messages`: each element's canonical reading, the first [`MAX_SEGMENTS`] kept.
struct MessagesSeed;

impl<'de> DeserializeSeed<'de> for MessagesSeed {
    type Value = (Vec<Canon>, u64);

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for MessagesSeed {
    type Value = (Vec<Canon>, u64);

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of messages")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut kept = Vec::new();
        let mut past = 0;
        while let Some(message) = seq.next_element_seed(ValueSeed { role: false })? {
            if kept.len() < MAX_SEGMENTS {
                kept.push(message);
            } else {
                past += message.size;
            }
        }
        Ok((kept, past))
    }

    /// Not an array (a malformed request the backend will refuse): no messages.
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok((Vec::new(), 0))
    }
}

/// A completions `prompt`: a string in pieces; any other value one segment.
struct TextSeed;

impl<'de> DeserializeSeed<'de> for TextSeed {
    type Value = Vec<Canon>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Vec<Canon>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TextSeed {
    type Value = Vec<Canon>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a prompt")
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Vec<Canon>, E> {
        Ok(pieces(s))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Vec<Canon>, A::Error> {
        ValueSeed { role: false }.visit_seq(seq).map(|c| vec![c])
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Vec<Canon>, A::Error> {
        ValueSeed { role: false }.visit_map(map).map(|c| vec![c])
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Vec<Canon>, E> {
        Ok(vec![scalar(UNSIGNED, n)])
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Vec<Canon>, E> {
        Ok(vec![scalar(SIGNED, n as u64)])
    }

    fn visit_f64<E: de::Error>(self, n: f64) -> Result<Vec<Canon>, E> {
        Ok(vec![scalar(FLOAT, n.to_bits())])
    }

    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Vec<Canon>, E> {
        Ok(vec![scalar(if b { TRUE } else { FALSE }, 0)])
    }

    fn visit_unit<E: de::Error>(self) -> Result<Vec<Canon>, E> {
        Ok(Vec::new())
    }
}

/// Any JSON value, read canonically. `role`: the value of a `role` key (an `"assistant"`
/// string marks its object as an assistant message).
#[derive(Clone, Copy)]
struct ValueSeed {
    role: bool,
}

impl<'de> DeserializeSeed<'de> for ValueSeed {
    type Value = Canon;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Canon, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ValueSeed {
    type Value = Canon;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Canon, E> {
        Ok(scalar(NULL, 0))
    }

    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Canon, E> {
        Ok(scalar(if b { TRUE } else { FALSE }, 0))
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Canon, E> {
        Ok(scalar(UNSIGNED, n))
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Canon, E> {
        Ok(scalar(SIGNED, n as u64))
    }

    fn visit_f64<E: de::Error>(self, n: f64) -> Result<Canon, E> {
        Ok(scalar(FLOAT, n.to_bits()))
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Canon, E> {
        Ok(Canon { assistant: self.role && s == "assistant", ..string(s) })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Canon, A::Error> {
        let mut hash = ARRAY;
        let mut size = 2;
        while let Some(element) = seq.next_element_seed(ValueSeed { role: false })? {
            hash = combine(hash, element.hash);
            size += element.size + 1;
        }
        Ok(Canon { hash, size, assistant: false })
    }

    /// Members are hashed apart and summed, so that their order does not count.
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Canon, A::Error> {
        let mut sum = 0u64;
        let mut members = 0u64;
        let mut size = 2;
        let mut assistant = false;
        while let Some(key) = map.next_key_seed(KeySeed)? {
            let value = map.next_value_seed(ValueSeed { role: key.name == Name::Role })?;
            if key.name == Name::CacheControl {
                continue;
            }
            if key.name == Name::Role {
                assistant = value.assistant;
            }
            sum = sum.wrapping_add(xxh3_64_with_seed(&value.hash.to_le_bytes(), key.canon.hash ^ MEMBER));
            members += 1;
            size += key.canon.size + value.size + 2;
        }
        Ok(Canon { hash: combine(combine(OBJECT, members), sum), size, assistant })
    }
}

#[cfg(test)]
mod tests;
