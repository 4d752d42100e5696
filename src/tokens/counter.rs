//! The model's own tokenizer and chat template ([`Counter`]), found on disk ([`locate`]: a
//! local directory or the local Hugging Face cache, never the network), and the conservative
//! [`Estimate`] used when no tokenizer is found. Everything is loaded and compiled once at
//! start-up; counting does no I/O.

use std::path::{Path, PathBuf};

use serde_json::Value as Json;
use tokenizers::Tokenizer;
use unicode_normalization::{IsNormalized, is_nfc_quick};

use super::template::{ChatTemplate, Variables};
use super::{ChatPrompt, Count, CountError};

/// The named special tokens transformers passes to the chat template (its
/// `SPECIAL_TOKENS_ATTRIBUTES`), read from `tokenizer_config.json`.
const SPECIAL_TOKENS: [&str; 7] =
    ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"];

/// Why a model directory's tokenizer could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A file could not be read.
    #[error("{path}: cannot read it: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// `tokenizer.json` is not something the `tokenizers` crate loads.
    #[error("{path}: not a tokenizer the `tokenizers` crate can load: {reason}")]
    Tokenizer {
        /// The file.
        path: PathBuf,
        /// What the crate said.
        reason: String,
    },
    /// `tokenizer_config.json` is not JSON or one of its fields has the wrong shape.
    #[error("{path}: {reason}")]
    Config {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the field.
        reason: String,
    },
    /// The chat template does not compile.
    #[error("{path}: the chat template does not compile: {reason}")]
    Template {
        /// The file the template came from.
        path: PathBuf,
        /// The template engine's message (with the line).
        reason: String,
    },
}

/// A model's chat templates: the default one and, when the model has one, the template
/// transformers picks when tools are given (`tool_use`).
struct Templates {
    default: ChatTemplate,
    tool_use: Option<ChatTemplate>,
}

/// The model's own tokenizer and chat template: counts as `transformers`'
/// `apply_chat_template(..., add_generation_prompt=True, tokenize=True)` does.
///
/// A model without any chat template is counted as `mlx_lm.server` prompts it: its
/// `convert_chat` fallback (`"USER: …\nASSISTANT: "`, special tokens added by the tokenizer).
/// [`Counter::load`] logs a warning when that is the case ([`Counter::has_chat_template`]).
pub struct Counter {
    tokenizer: Tokenizer,
    templates: Option<Templates>,
    special_tokens: Vec<(String, String)>,
    /// Whether a long text may be cut at a line start and its halves encoded on two threads
    /// (see [`splittable`]).
    splits: bool,
    /// Tokens the post-processor adds around a text (BOS/EOS), counted once for a cut text.
    added_around: usize,
    /// The tokenizer has a normalizer (which may change a text's length).
    normalizes: bool,
}

/// Texts at least this long (bytes, about 4k tokens) are encoded in two halves at once: a
/// 53k-token prompt then costs half the time (the bench: `cargo bench --bench count_tokens`).
const SPLIT_AT_BYTES: usize = 16 * 1024;

impl Counter {
    /// Loads `tokenizer.json`, the chat template (`chat_template.jinja` first, as transformers 5
    /// does, else `tokenizer_config.json`'s `chat_template`) and the special tokens from a model
    /// directory, compiling the template once.
    pub fn load(dir: &Path) -> Result<Counter, LoadError> {
        let tokenizer_path = dir.join("tokenizer.json");
        let mut tokenizer = Tokenizer::from_file(&tokenizer_path)
            .map_err(|e| LoadError::Tokenizer { path: tokenizer_path.clone(), reason: e.to_string() })?;
        // transformers counts without the truncation or padding a tokenizer.json may carry (an
        // embedding model's `max_length: 512` would hide every input over its cap).
        tokenizer
            .with_truncation(None)
            .map_err(|e| LoadError::Tokenizer { path: tokenizer_path, reason: e.to_string() })?;
        tokenizer.with_padding(None);
        let config_path = dir.join("tokenizer_config.json");
        let config = read_json_if_present(&config_path)?;
        let special_tokens = special_tokens(&config_path, config.as_ref())?;
        let templates = load_templates(dir, &config_path, config.as_ref())?;
        if templates.is_none() {
            tracing::warn!(
                dir = %dir.display(),
                "the model has no chat template: chat prompts are counted as mlx_lm.server's \
                 plain-text fallback renders them (USER:/ASSISTANT: lines)"
            );
        }
        let splits = splittable(&tokenizer);
        let with = tokenizer.encode_fast("", true).map_or(0, |e| e.len());
        let without = tokenizer.encode_fast("", false).map_or(0, |e| e.len());
        let normalizes = tokenizer.get_normalizer().is_some();
        Ok(Counter {
            tokenizer,
            templates,
            special_tokens,
            splits,
            added_around: with.saturating_sub(without),
            normalizes,
        })
    }

    /// Whether the model has a chat template (false: chat prompts use the documented fallback).
    pub fn has_chat_template(&self) -> bool {
        self.templates.is_some()
    }

    /// The chat prompt's text as the chat template renders it (`tokenize=False`), or as
    /// mlx_lm.server's fallback renders it when the model has no template.
    pub fn render(&self, prompt: ChatPrompt<'_>) -> Result<String, CountError> {
        let Some(templates) = &self.templates else {
            return Ok(plain_chat(prompt.messages));
        };
        let template = match (&templates.tool_use, prompt.tools) {
            (Some(tool_use), Some(_)) => tool_use,
            _ => &templates.default,
        };
        let vars =
            Variables { tools: prompt.tools, special_tokens: &self.special_tokens, kwargs: prompt.template_kwargs };
        template.render(prompt.messages, &vars).map_err(|e| CountError::Template(template_error(&e)))
    }

    fn count(&self, text: &str, add_special_tokens: bool) -> usize {
        if let Some(cut) = self.cut(text) {
            let (head, tail) = text.split_at(cut);
            let (a, b) = std::thread::scope(|scope| {
                let tail = scope.spawn(|| self.count_whole(tail, false));
                let head = self.count_whole(head, false);
                (head, tail.join().unwrap_or_else(|_| self.count_whole(text, false)))
            });
            return a + b + if add_special_tokens { self.added_around } else { 0 };
        }
        self.count_whole(text, add_special_tokens)
    }

    fn count_whole(&self, text: &str, add_special_tokens: bool) -> usize {
        match self.tokenizer.encode_fast(text, add_special_tokens) {
            Ok(encoding) => encoding.len(),
            // Only a pathological input fails to encode; one token per byte bounds any
            // byte-level BPE from above.
            Err(_) => text.len(),
        }
    }

    /// Where a long text can be cut so that its halves' tokens are exactly its own: the start
    /// of a line that begins with a letter, near the middle, where the tokenizer's
    /// pre-tokenizer itself splits (BPE merges never cross a pre-token). `None`: encode whole.
    fn cut(&self, text: &str) -> Option<usize> {
        if !self.splits || text.len() < SPLIT_AT_BYTES {
            return None;
        }
        let bytes = text.as_bytes();
        let middle = text.len() / 2;
        let candidates = memchr::memchr_iter(b'\n', &bytes[middle..]).map(|i| middle + i + 1);
        candidates.take(256).find(|&at| self.cut_is_exact(text, at))
    }

    fn cut_is_exact(&self, text: &str, at: usize) -> bool {
        if !text[at..].chars().next().is_some_and(char::is_alphabetic) {
            return false;
        }
        // The pre-tokenizer is local (a regex over the text): ask it about a window around the
        // cut.
        let mut start = at.saturating_sub(256);
        while !text.is_char_boundary(start) {
            start -= 1;
        }
        let mut end = (at + 256).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        let Some(pre_tokenizer) = self.tokenizer.get_pre_tokenizer() else { return false };
        let mut window = tokenizers::PreTokenizedString::from(&text[start..end]);
        if tokenizers::PreTokenizer::pre_tokenize(pre_tokenizer, &mut window).is_err() {
            return false;
        }
        let cut = at - start;
        window
            .get_splits(tokenizers::OffsetReferential::Original, tokenizers::OffsetType::Byte)
            .iter()
            .any(|(_, (from, _), _)| *from == cut)
    }
}

/// Whether texts may be cut at line starts and encoded in pieces with the same tokens: a
/// byte-level BPE (GPT-2, Llama 3, Qwen: its pre-tokenizer splits on a regex and never adds a
/// space at a piece's start), no normalizer other than NFC (which never joins a newline with
/// the letter after it), and no special token containing a newline. SentencePiece-style
/// tokenizers (Metaspace, which marks the start of a text) are encoded whole.
fn splittable(tokenizer: &Tokenizer) -> bool {
    let json = |v: Option<String>| v.unwrap_or_default();
    let pre = json(tokenizer.get_pre_tokenizer().and_then(|p| serde_json::to_string(p).ok()));
    let normalizer = json(tokenizer.get_normalizer().and_then(|n| serde_json::to_string(n).ok()));
    let byte_level =
        pre.contains("\"ByteLevel\"") && !pre.contains("Metaspace") && !pre.contains("\"add_prefix_space\":true");
    let normalizer_ok = normalizer.is_empty() || normalizer == r#"{"type":"NFC"}"#;
    let specials_ok = tokenizer.get_added_tokens_decoder().values().all(|t| !t.content.contains('\n'));
    byte_level && normalizer_ok && specials_ok
}

impl Count for Counter {
    fn chat_tokens(&self, prompt: ChatPrompt<'_>) -> Result<usize, CountError> {
        let text = self.render(prompt)?;
        // apply_chat_template(tokenize=True) encodes without special tokens; mlx_lm's
        // fallback uses tokenizer.encode, which adds them.
        Ok(self.count(&text, self.templates.is_none()))
    }

    fn chat_tokens_at_most(&self, prompt: ChatPrompt<'_>) -> Result<usize, CountError> {
        // Every token covers at least one byte of the text the tokenizer sees (byte-level BPE,
        // byte fallback); the post-processor adds `added_around`, a SentencePiece prefix one. A
        // normalizer may lengthen a text that is not already NFC (U+1D160: 4 bytes → 12), so
        // such a text is counted exactly.
        let text = self.render(prompt)?;
        if self.normalizes && is_nfc_quick(text.chars()) != IsNormalized::Yes {
            return Ok(self.count(&text, self.templates.is_none()));
        }
        Ok(text.len() + self.added_around + 1)
    }

    fn text_tokens(&self, text: &str) -> usize {
        self.count(text, true)
    }

    fn encode(&self, text: &str) -> Vec<u32> {
        self.tokenizer.encode_fast(text, false).map(|e| e.get_ids().to_vec()).unwrap_or_default()
    }

    fn decode(&self, ids: &[u32]) -> String {
        self.tokenizer.decode(ids, false).unwrap_or_default()
    }

    fn exact(&self) -> bool {
        true
    }
}

/// A template error with its cause chain (minijinja puts the line in the source).
fn template_error(error: &minijinja::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// mlx_lm.server's `convert_chat`: what it tokenizes when the model has no chat template.
fn plain_chat(messages: &[Json]) -> String {
    let mut prompt = String::new();
    for message in messages {
        let prefix = match message.get("role").and_then(Json::as_str) {
            Some("system") => "ASSISTANT's RULE: ",
            Some("user") => "USER: ",
            Some("assistant") => "ASSISTANT: ",
            _ => "",
        };
        prompt.push_str(prefix);
        match message.get("content") {
            Some(Json::String(text)) => prompt.push_str(text),
            Some(Json::Null) | None => {}
            Some(other) => prompt.push_str(&other.to_string()),
        }
        prompt.push('\n');
    }
    prompt.push_str("ASSISTANT: ");
    prompt.truncate(prompt.trim_end().len());
    prompt
}

fn read_json_if_present(path: &Path) -> Result<Option<Json>, LoadError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(LoadError::Read { path: path.into(), source }),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| LoadError::Config { path: path.into(), reason: format!("not valid JSON: {e}") })
}

/// The named special tokens, as strings: a token is a string or an AddedToken object
/// (`{"content": "<s>", ...}`); null or absent tokens are left out, as transformers does.
fn special_tokens(path: &Path, config: Option<&Json>) -> Result<Vec<(String, String)>, LoadError> {
    let mut tokens = Vec::new();
    let Some(config) = config else { return Ok(tokens) };
    for name in SPECIAL_TOKENS {
        let content = match config.get(name) {
            None | Some(Json::Null) => continue,
            Some(Json::String(s)) => s,
            Some(Json::Object(token)) => match token.get("content") {
                Some(Json::String(s)) => s,
                _ => {
                    return Err(LoadError::Config {
                        path: path.into(),
                        reason: format!("`{name}` is an object without a string `content`"),
                    });
                }
            },
            Some(_) => {
                return Err(LoadError::Config {
                    path: path.into(),
                    reason: format!("`{name}` must be a string or an object with `content`"),
                });
            }
        };
        tokens.push((name.to_owned(), content.clone()));
    }
    Ok(tokens)
}

/// The model's chat templates: `chat_template.jinja` wins over `tokenizer_config.json`.
fn load_templates(dir: &Path, config_path: &Path, config: Option<&Json>) -> Result<Option<Templates>, LoadError> {
    let jinja_path = dir.join("chat_template.jinja");
    match std::fs::read_to_string(&jinja_path) {
        Ok(source) => {
            let default = compile(&jinja_path, source)?;
            return Ok(Some(Templates { default, tool_use: None }));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => return Err(LoadError::Read { path: jinja_path, source }),
    }
    let Some(field) = config.and_then(|c| c.get("chat_template")) else { return Ok(None) };
    let config_error = |reason: &str| LoadError::Config { path: config_path.into(), reason: reason.into() };
    match field {
        Json::Null => Ok(None),
        Json::String(source) => Ok(Some(Templates { default: compile(config_path, source.clone())?, tool_use: None })),
        Json::Array(named) => {
            let find = |wanted: &str| -> Result<Option<String>, LoadError> {
                for entry in named {
                    let name = entry.get("name").and_then(Json::as_str);
                    let template = entry.get("template").and_then(Json::as_str);
                    match (name, template) {
                        (Some(name), Some(template)) if name == wanted => return Ok(Some(template.to_owned())),
                        (Some(_), Some(_)) => {}
                        _ => {
                            return Err(config_error(
                                "`chat_template` list entries must be {\"name\", \"template\"} strings",
                            ));
                        }
                    }
                }
                Ok(None)
            };
            let Some(default) = find("default")? else {
                return Err(config_error("`chat_template` is a list of named templates without one named \"default\""));
            };
            let tool_use = find("tool_use")?.map(|source| compile(config_path, source)).transpose()?;
            Ok(Some(Templates { default: compile(config_path, default)?, tool_use }))
        }
        _ => Err(config_error("`chat_template` must be a string or a list of {\"name\", \"template\"}")),
    }
}

fn compile(path: &Path, source: String) -> Result<ChatTemplate, LoadError> {
    ChatTemplate::compile(source).map_err(|e| LoadError::Template { path: path.into(), reason: template_error(&e) })
}

/// The model directory holding `tokenizer.json` for a backend's `model`: the path itself when
/// it is a local directory with one, else a Hugging Face id (`org/name`) resolved in the local
/// Hugging Face cache (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`),
/// without the network.
pub fn locate(model: &str) -> Option<PathBuf> {
    let env = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    let hub = hub_cache(env("HF_HUB_CACHE"), env("HF_HOME"), env("HOME"))?;
    locate_in(model, &hub)
}

/// Where the Hugging Face hub cache is, from `HF_HUB_CACHE`, `HF_HOME` and `HOME`.
fn hub_cache(hf_hub_cache: Option<PathBuf>, hf_home: Option<PathBuf>, home: Option<PathBuf>) -> Option<PathBuf> {
    hf_hub_cache.or_else(|| hf_home.map(|h| h.join("hub"))).or_else(|| home.map(|h| h.join(".cache/huggingface/hub")))
}

/// [`locate`] with the hub cache given: `models--org--name/refs/main` names the snapshot;
/// without it (or when that snapshot has no tokenizer), the newest snapshot with one.
fn locate_in(model: &str, hub: &Path) -> Option<PathBuf> {
    let local = Path::new(model);
    if local.join("tokenizer.json").is_file() {
        return Some(local.to_path_buf());
    }
    let (org, name) = model.split_once('/')?;
    if org.is_empty() || name.is_empty() || name.contains('/') || org.starts_with('.') {
        return None;
    }
    let repo = hub.join(format!("models--{org}--{name}"));
    let snapshots = repo.join("snapshots");
    if let Ok(commit) = std::fs::read_to_string(repo.join("refs/main")) {
        let dir = snapshots.join(commit.trim());
        if dir.join("tokenizer.json").is_file() {
            return Some(dir);
        }
    }
    std::fs::read_dir(&snapshots)
        .ok()?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|dir| dir.join("tokenizer.json").is_file())
        .max_by_key(|dir| dir.metadata().and_then(|m| m.modified()).ok())
}

/// A conservative (over-)estimate of prompt tokens, used when no tokenizer is found.
///
/// The rule: text is cut into pieces, each one "token": runs of ASCII letters and `_` (with at
/// most one space before them, an upper-case letter starting a new run) and runs of
/// whitespace, in pieces of at most 3 bytes; each digit one piece (Qwen splits numbers into
/// digits); each other ASCII character (punctuation) one piece; each other character of the Basic Multilingual Plane (a CJK character, an accented
/// letter) one piece, each character beyond it (emoji) two. A chat prompt adds
/// [`Estimate::PER_MESSAGE`] tokens per message (role markers and the template's framing) and
/// [`Estimate::PER_PROMPT`] once (the generation prompt), counts every field of each message
/// (its JSON text when not a string, so tool calls and content parts count), and the tools' JSON
/// text plus [`Estimate::TOOLS_PREAMBLE`] when tools are given. A text prompt adds one token (a
/// BOS).
///
/// Real BPE vocabularies (Qwen's 150k+) average 4+ bytes per token on English, 3+ on code and
/// less than one token per CJK character, so this over-counts them; toy vocabularies of a few
/// hundred tokens (the tiny test model: ~1.2 bytes per token) are not bounded by it. `encode`
/// gives the pieces as ids that `decode` turns back into the text, so prompts can still be cut
/// at "token" boundaries.
#[derive(Debug, Clone, Copy, Default)]
pub struct Estimate;

/// An id holding up to 3 ASCII bytes (7 bits each) and their count (bits 21-22).
const ASCII_PIECE: u32 = 1 << 31;
/// What an ASCII character is, for cutting estimate pieces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Word,
    /// Digits: real vocabularies split numbers into single digits (Qwen) or groups of three
    /// (Llama 3): one piece each.
    Digit,
    Space,
    Punct,
}

impl Class {
    fn of(c: char) -> Class {
        match c {
            c if c.is_ascii_digit() => Class::Digit,
            c if c.is_ascii_alphabetic() || c == '_' => Class::Word,
            c if c.is_ascii_whitespace() => Class::Space,
            _ => Class::Punct,
        }
    }
}

/// [`Class::of`] for every ASCII byte.
const ASCII_CLASS: [Class; 128] = {
    let mut classes = [Class::Punct; 128];
    let mut b = 0;
    while b < 128 {
        classes[b] = match b as u8 {
            b'0'..=b'9' => Class::Digit,
            b'a'..=b'z' | b'A'..=b'Z' | b'_' => Class::Word,
            b' ' | b'\t' | b'\n' | b'\x0C' | b'\r' => Class::Space,
            _ => Class::Punct,
        };
        b += 1;
    }
    classes
};

/// The second id of a character beyond the Basic Multilingual Plane (decodes to nothing).
const SECOND_HALF: u32 = 1 << 30;

impl Estimate {
    /// Tokens added per chat message.
    pub const PER_MESSAGE: usize = 8;
    /// Tokens added once per chat prompt.
    pub const PER_PROMPT: usize = 8;
    /// Tokens added when tools are given (templates wrap them in instructions).
    pub const TOOLS_PREAMBLE: usize = 256;

    /// The estimate for a text, without any framing (the length of [`Count::encode`]).
    ///
    /// Counted over the bytes (the pieces [`Count::encode`] gives, not built): this runs on
    /// every request's prompt fields.
    pub fn text(text: &str) -> usize {
        let mut count = 0;
        let mut len = 0u32;
        let mut class = Class::Punct;
        // The piece so far is a lone space.
        let mut lone_space = false;
        for &b in text.as_bytes() {
            if !b.is_ascii() {
                // A character's first byte: its piece (two beyond the Basic Multilingual Plane).
                if b & 0xC0 != 0x80 {
                    count += usize::from(len > 0) + 1 + usize::from(b >= 0xF0);
                    len = 0;
                }
                continue;
            }
            let next = ASCII_CLASS[usize::from(b)];
            let joins = len > 0
                && len < 3
                && !b.is_ascii_uppercase()
                && (next == class && class != Class::Punct && class != Class::Digit
                    || (class == Class::Space && len == 1 && lone_space && next == Class::Word));
            if len > 0 && !joins {
                count += 1;
                len = 0;
            }
            if len == 0 {
                lone_space = b == b' ';
            }
            len += 1;
            class = next;
        }
        count + usize::from(len > 0)
    }

    fn pieces(text: &str, mut piece: impl FnMut(u32)) {
        let mut ascii = 0u32;
        let mut len = 0u32;
        let mut class = Class::Punct;
        for c in text.chars() {
            if !c.is_ascii() {
                if len > 0 {
                    piece(ASCII_PIECE | (len << 21) | ascii);
                    (ascii, len) = (0, 0);
                }
                piece(c as u32);
                if c as u32 > 0xFFFF {
                    piece(SECOND_HALF);
                }
                continue;
            }
            let next = Class::of(c);
            // A piece goes on with the same class (a lone space joins the word after it, as
            // BPE's " word" tokens do); punctuation and digits are one piece per character; an
            // upper-case letter starts a piece (camelCase, acronyms, base64).
            let case_change = c.is_ascii_uppercase();
            let joins = len > 0
                && len < 3
                && !case_change
                && (next == class && class != Class::Punct && class != Class::Digit
                    || (class == Class::Space && len == 1 && ascii == u32::from(b' ') && next == Class::Word));
            if len > 0 && !joins {
                piece(ASCII_PIECE | (len << 21) | ascii);
                (ascii, len) = (0, 0);
            }
            ascii |= (c as u32) << (7 * len);
            len += 1;
            class = next;
        }
        if len > 0 {
            piece(ASCII_PIECE | (len << 21) | ascii);
        }
    }

    fn json(value: &Json) -> usize {
        match value {
            Json::String(s) => Self::text(s),
            other => Self::text(&other.to_string()),
        }
    }
}

impl Count for Estimate {
    fn chat_tokens(&self, prompt: ChatPrompt<'_>) -> Result<usize, CountError> {
        let message = |m: &Json| {
            Self::PER_MESSAGE + m.as_object().map_or_else(|| Self::json(m), |o| o.values().map(Self::json).sum())
        };
        let messages: usize = prompt.messages.iter().map(message).sum();
        let tools = prompt.tools.map_or(0, |tools| Self::TOOLS_PREAMBLE + tools.iter().map(Self::json).sum::<usize>());
        let kwargs = prompt.template_kwargs.map_or(0, |k| k.values().map(Self::json).sum());
        Ok(Self::PER_PROMPT + messages + tools + kwargs)
    }

    fn text_tokens(&self, text: &str) -> usize {
        Self::text(text) + 1
    }

    fn encode(&self, text: &str) -> Vec<u32> {
        let mut ids = Vec::with_capacity(text.len() / 3 + 1);
        Self::pieces(text, |id| ids.push(id));
        ids
    }

    fn decode(&self, ids: &[u32]) -> String {
        let mut text = String::with_capacity(ids.len() * 3);
        for &id in ids {
            if id & ASCII_PIECE != 0 {
                let len = (id >> 21) & 3;
                text.extend((0..len).filter_map(|i| char::from_u32((id >> (7 * i)) & 0x7f)));
            } else if id != SECOND_HALF {
                text.extend(char::from_u32(id));
            }
        }
        text
    }

    fn exact(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const TINY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/.cache/tiny-qwen3");

    /// A model directory with the tiny model's tokenizer.json and the given config files.
    fn model_dir(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(Path::new(TINY).join("tokenizer.json"), dir.path().join("tokenizer.json")).unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        dir
    }

    fn chat(messages: &[Json]) -> ChatPrompt<'_> {
        ChatPrompt { messages, tools: None, template_kwargs: None }
    }

    #[test]
    fn a_long_text_cut_at_a_line_start_counts_exactly_as_whole() {
        let counter = Counter::load(Path::new(TINY)).unwrap();
        assert!(counter.splits, "the tiny byte-level BPE may be cut");
        let mut text = String::new();
        let lines = [
            "model token stream,",
            "  indented code();",
            "\u{4e16}\u{754c} cache",
            "e\u{301}t\u{e9} swap",
            "",
            "gateway",
        ];
        for i in 0..4000 {
            text.push_str(lines[i % lines.len()]);
            text.push_str(if i % 7 == 0 { "\n\n" } else { "\n" });
        }
        assert!(text.len() >= SPLIT_AT_BYTES);
        assert!(counter.cut(&text).is_some(), "a line start near the middle is found");
        assert_eq!(counter.count(&text, false), counter.count_whole(&text, false));
        assert_eq!(counter.count(&text, true), counter.count_whole(&text, true));
        // No line starts with a letter: encoded whole.
        let digits = "1234\n".repeat(5000);
        assert_eq!(counter.cut(&digits), None);
    }

    #[test]
    fn special_tokens_come_from_strings_and_added_token_objects() {
        let config = json!({
            "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false},
            "eos_token": "</s>",
            "unk_token": null,
            "chat_template": "{{ bos_token }}|{{ eos_token }}|{{ unk_token is defined }}|{{ pad_token }}"
        });
        let dir = model_dir(&[("tokenizer_config.json", &config.to_string())]);
        let counter = Counter::load(dir.path()).unwrap();
        assert_eq!(counter.render(chat(&[])).unwrap(), "<s>|</s>|False|");
    }

    #[test]
    fn template_kwargs_override_special_tokens_and_reach_the_template() {
        let config = json!({"eos_token": "</s>", "chat_template": "{{ eos_token }} {{ enable_thinking }}"});
        let dir = model_dir(&[("tokenizer_config.json", &config.to_string())]);
        let counter = Counter::load(dir.path()).unwrap();
        let kwargs = json!({"eos_token": "E", "enable_thinking": false});
        let prompt = ChatPrompt { messages: &[], tools: None, template_kwargs: kwargs.as_object() };
        assert_eq!(counter.render(prompt).unwrap(), "E False");
    }

    #[test]
    fn chat_template_list_takes_default_and_tool_use_with_tools() {
        let config = json!({"chat_template": [
            {"name": "tool_use", "template": "tools"},
            {"name": "default", "template": "plain"},
        ]});
        let dir = model_dir(&[("tokenizer_config.json", &config.to_string())]);
        let counter = Counter::load(dir.path()).unwrap();
        assert_eq!(counter.render(chat(&[])).unwrap(), "plain");
        let tools = [json!({"type": "function"})];
        let prompt = ChatPrompt { messages: &[], tools: Some(&tools), template_kwargs: None };
        assert_eq!(counter.render(prompt).unwrap(), "tools");
    }

    #[test]
    fn chat_template_jinja_wins_over_the_config() {
        let config = json!({"chat_template": "from config"});
        let dir = model_dir(&[("tokenizer_config.json", &config.to_string()), ("chat_template.jinja", "from jinja\n")]);
        let counter = Counter::load(dir.path()).unwrap();
        // jinja2 drops a single trailing newline of the source (keep_trailing_newline=False).
        assert_eq!(counter.render(chat(&[])).unwrap(), "from jinja");
    }

    #[test]
    fn load_errors_name_the_file_and_the_problem() {
        let cases: [(&[(&str, &str)], &str); 5] = [
            (&[("tokenizer_config.json", "{")], "tokenizer_config.json: not valid JSON"),
            (&[("tokenizer_config.json", r#"{"chat_template": 3}"#)], "`chat_template` must be a string or a list"),
            (
                &[("tokenizer_config.json", r#"{"chat_template": [{"name": "x", "template": "y"}]}"#)],
                "without one named \"default\"",
            ),
            (&[("tokenizer_config.json", r#"{"eos_token": 3}"#)], "`eos_token` must be a string"),
            (&[("chat_template.jinja", "{% if %}")], "chat_template.jinja: the chat template does not compile"),
        ];
        for (files, want) in cases {
            let dir = model_dir(files);
            let err = Counter::load(dir.path()).err().expect("load must fail").to_string();
            assert!(err.contains(want), "{err:?} should say {want:?}");
        }
        let empty = tempfile::tempdir().unwrap();
        let err = Counter::load(empty.path()).err().expect("no tokenizer.json").to_string();
        assert!(err.contains("tokenizer.json: not a tokenizer"), "{err}");
    }

    #[test]
    fn a_template_exception_is_a_count_error() {
        let config = json!({"chat_template": "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}"});
        let dir = model_dir(&[("tokenizer_config.json", &config.to_string())]);
        let counter = Counter::load(dir.path()).unwrap();
        let err = counter.chat_tokens(chat(&[json!({"role": "assistant", "content": "x"})])).unwrap_err();
        assert!(err.to_string().contains("first must be user"), "{err}");
    }

    #[test]
    fn without_a_template_chat_is_counted_as_mlx_lm_falls_back() {
        let dir = model_dir(&[]);
        let counter = Counter::load(dir.path()).unwrap();
        assert!(!counter.has_chat_template());
        let messages = [json!({"role": "system", "content": "Be brief."}), json!({"role": "user", "content": "Hi"})];
        let text = counter.render(chat(&messages)).unwrap();
        assert_eq!(text, "ASSISTANT's RULE: Be brief.\nUSER: Hi\nASSISTANT:");
        assert_eq!(counter.chat_tokens(chat(&messages)).unwrap(), counter.text_tokens(&text));
    }

    #[test]
    fn tiny_model_counts_chatml_and_round_trips_text() {
        let counter = Counter::load(Path::new(TINY)).unwrap();
        let messages = [json!({"role": "user", "content": "Hello"})];
        assert_eq!(
            counter.render(chat(&messages)).unwrap(),
            "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
        );
        let content = counter.encode("Hello").len();
        // <|im_start|> "user" "\n" ... <|im_end|> "\n" <|im_start|> "assistant" "\n": special
        // tokens are single ids.
        let framing =
            counter.encode("user\n").len() + counter.encode("\n").len() + counter.encode("assistant\n").len() + 3;
        assert_eq!(counter.chat_tokens(chat(&messages)).unwrap(), content + framing);
        let text = "naïve 漢字 😀 code(x) {}";
        assert_eq!(counter.decode(&counter.encode(text)), text);
    }

    #[test]
    fn locate_finds_a_local_directory_then_the_hub_cache() {
        let root = tempfile::tempdir().unwrap();
        let local = root.path().join("local-model");
        std::fs::create_dir(&local).unwrap();
        std::fs::write(local.join("tokenizer.json"), "{}").unwrap();
        assert_eq!(locate_in(local.to_str().unwrap(), Path::new("/nonexistent")), Some(local.clone()));

        let hub = root.path().join("hub");
        let repo = hub.join("models--org--name");
        for commit in ["aaa", "bbb", "ccc"] {
            std::fs::create_dir_all(repo.join("snapshots").join(commit)).unwrap();
        }
        // No tokenizer anywhere yet.
        assert_eq!(locate_in("org/name", &hub), None);
        std::fs::write(repo.join("snapshots/aaa/tokenizer.json"), "{}").unwrap();
        // No refs/main: the (newest) snapshot holding a tokenizer.
        assert_eq!(locate_in("org/name", &hub), Some(repo.join("snapshots/aaa")));
        std::fs::write(repo.join("snapshots/bbb/tokenizer.json"), "{}").unwrap();
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), "bbb\n").unwrap();
        assert_eq!(locate_in("org/name", &hub), Some(repo.join("snapshots/bbb")));
        // refs/main naming a snapshot without a tokenizer: fall back to one that has it.
        std::fs::write(repo.join("refs/main"), "ccc").unwrap();
        assert!(locate_in("org/name", &hub).is_some_and(|d| d.join("tokenizer.json").is_file()));
        assert_eq!(locate_in("other/model", &hub), None);
        assert_eq!(locate_in("not-an-id", &hub), None);
    }

    #[test]
    fn hub_cache_follows_hugging_face_precedence() {
        let p = |s: &str| Some(PathBuf::from(s));
        assert_eq!(hub_cache(p("/c"), p("/h"), p("/home")), p("/c"));
        assert_eq!(hub_cache(None, p("/h"), p("/home")), p("/h/hub"));
        assert_eq!(hub_cache(None, None, p("/home")), p("/home/.cache/huggingface/hub"));
        assert_eq!(hub_cache(None, None, None), None);
    }

    #[test]
    fn estimate_pieces_decode_back_and_match_the_count() {
        let text = "Hello, world! naïve 漢字 😀👍🏽 tab\there";
        let ids = Estimate.encode(text);
        assert_eq!(ids.len(), Estimate::text(text));
        assert_eq!(Estimate.decode(&ids), text);
        assert!(!Estimate.exact());
        // "abcdef" = 2 pieces; "漢" = 1; "😀" = 2; " ab" 1, " " 1, "(" 1, "x" 1, ")" 1.
        assert_eq!(Estimate::text("abcdef漢😀 ab (x)"), 10);
        assert_eq!(Estimate::text(""), 0);
        let messages = [json!({"role": "user", "content": "abc"})];
        assert_eq!(
            Estimate.chat_tokens(chat(&messages)).unwrap(),
            Estimate::PER_PROMPT + Estimate::PER_MESSAGE + 2 + 1
        );
    }

    proptest::proptest! {
        /// The count over bytes is the number of pieces `encode` gives.
        #[test]
        fn the_estimate_s_count_is_its_pieces(text in "(\\PC|[ \t\nA-Za-z0-9_.,(){}\"\\\\-]){0,40}") {
            let mut pieces = 0;
            Estimate::pieces(&text, |_| pieces += 1);
            proptest::prop_assert_eq!(Estimate::text(&text), pieces);
        }
    }

    #[test]
    fn the_ascii_classes_are_class_of() {
        for b in 0..128u8 {
            assert_eq!(ASCII_CLASS[usize::from(b)], Class::of(char::from(b)), "{b}");
        }
    }
}
