//! The room arithmetic of a request: the backend's cap, the client's `max_tokens` and the
//! model's `min_room` ([`Budget`]): whether a prompt fits and with which `max_tokens`, the room a
//! transform makes for the answer, and what a refusal reports ([`Requested`]). Numbers from the
//! client are only added with checked or saturating arithmetic.

/// Room a transform makes for the answer: at most this, and at most a quarter of the cap (see
/// [`Budget::reserve`]).
const DEFAULT_ROOM: usize = 1024;

/// The tokens a request may use: the backend's cap, what the client asked to generate and the
/// least room for an answer that makes a prompt worth sending.
///
/// A prompt under the cap is never refused for its `max_tokens`: when prompt + `max_tokens` is
/// over the cap, the answer gets the room left ([`Budget::fitting`]). Only a prompt that leaves
/// less than [`Budget::needed`] is over the cap, and goes to the model's `on_overflow`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// The backend's context cap (prompt + generated tokens).
    pub cap: usize,
    /// The client's `max_tokens` / `max_completion_tokens`; `None` when not given.
    pub max_tokens: Option<usize>,
    /// The model's `min_room`: the least room a prompt must leave for its answer (a client that
    /// asked for fewer tokens needs only those). Used as at most half the cap, at least 1.
    pub min_room: usize,
}

/// What a refusal reports, in OpenAI's two wordings: "your messages resulted in N tokens" (the
/// prompt alone is over the cap) or "you requested N tokens (P in the messages, C in the
/// completion)".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Requested {
    /// The prompt's tokens.
    pub prompt: usize,
    /// The completion counted with the prompt: `None` when the prompt alone is over the cap;
    /// else the client's `max_tokens`, or when it gave none the room the gateway keeps.
    pub completion: Option<usize>,
}

impl Requested {
    /// Prompt and completion together, saturating.
    pub fn total(&self) -> usize {
        self.prompt.saturating_add(self.completion.unwrap_or(0))
    }
}

impl Budget {
    /// The least room a prompt must leave for its answer: the model's `min_room` (at most half
    /// the cap), or the client's `max_tokens` when smaller; at least 1.
    pub fn needed(&self) -> usize {
        let min_room = self.min_room.min(self.cap / 2);
        min_room.min(self.max_tokens.unwrap_or(usize::MAX)).max(1)
    }

    /// The room a transform (middle-out, chunk) makes for the answer: what the answer is likely
    /// to need, not what the client allowed (agents send `max_tokens: 32000` on a 32k model,
    /// which would leave nothing of the prompt): `min(1024, cap / 4)`, at least
    /// [`Budget::needed`], at most the client's `max_tokens`.
    pub fn reserve(&self) -> usize {
        let target = DEFAULT_ROOM.min(self.cap / 4).max(self.needed());
        target.min(self.max_tokens.unwrap_or(usize::MAX))
    }

    /// The largest prompt a transform may produce.
    pub(super) fn prompt_limit(&self) -> usize {
        self.cap.saturating_sub(self.reserve())
    }

    /// The `max_tokens` to send with a prompt of `prompt_tokens` as it is, or `None` when it is
    /// over the cap (it leaves less than [`Budget::needed`]). The client's `max_tokens` when
    /// prompt + `max_tokens` fits (computed without overflow: a client may send `u64::MAX`), else
    /// the room left; without `max_tokens`, the room left (the handler caps it by the model's
    /// default).
    pub fn fitting(&self, prompt_tokens: usize) -> Option<usize> {
        let room = self.cap.checked_sub(prompt_tokens)?;
        match self.max_tokens {
            Some(max) if max <= room => Some(max),
            _ => (room >= self.needed()).then_some(room),
        }
    }

    /// What a rejection of a prompt of `prompt_tokens` reports.
    pub fn requested(&self, prompt_tokens: usize) -> Requested {
        let completion = (prompt_tokens <= self.cap).then(|| self.max_tokens.unwrap_or_else(|| self.needed()));
        Requested { prompt: prompt_tokens, completion }
    }

    /// The `max_tokens` to send after a transform left a prompt of `prompt_tokens`: the room
    /// left, at most the client's `max_tokens`.
    pub(super) fn after_transform(&self, prompt_tokens: usize) -> usize {
        let room = self.cap.saturating_sub(prompt_tokens).max(1);
        room.min(self.max_tokens.unwrap_or(usize::MAX))
    }
}
