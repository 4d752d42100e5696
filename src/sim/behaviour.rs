//! The simulator's knobs. One `Behaviour` type is read from command-line flags (the server's
//! defaults) and from a request's `"sim": {…}` object (per-request overrides), then laid over a
//! `Style` preset that reproduces one real server's quirks (as measured in docs/wire-facts.md).

use serde::Deserialize;

/// Every knob is optional so that layers can be merged: request over flags over style.
#[derive(Debug, Clone, Default, Deserialize, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct Behaviour {
    /// Preset quirks of one real server.
    #[arg(long, value_enum)]
    pub style: Option<Style>,
    /// Delay before the first generated token, in milliseconds (prefill).
    #[arg(long)]
    pub ttft_ms: Option<u64>,
    /// Prefill time per prompt token the prompt cache did not spare, in milliseconds, added to
    /// `ttft_ms` (so that the time to first token shows the cache).
    #[arg(long)]
    pub prefill_ms_per_token: Option<f64>,
    /// Decode speed of one request running alone.
    #[arg(long)]
    pub tokens_per_second: Option<f64>,
    /// Tokens a response has (the request's max_tokens caps it).
    #[arg(long)]
    pub tokens: Option<u32>,
    /// Split the stream into writes of this many bytes (1 = a byte per write; 0 = whole frames).
    #[arg(long)]
    pub bytes_per_write: Option<usize>,
    /// Hold every token back and send them all in one write at the end (a detokenizer burst).
    #[arg(long)]
    pub burst: Option<bool>,
    /// What the server sends while it prefills.
    #[arg(long, value_enum)]
    pub keepalive: Option<Keepalive>,
    /// Interval between keepalives, in milliseconds.
    #[arg(long)]
    pub keepalive_ms: Option<u64>,
    /// Where the usage object goes in a stream.
    #[arg(long, value_enum)]
    pub usage: Option<UsagePlacement>,
    /// Send usage even when the client did not ask with stream_options.include_usage.
    #[arg(long)]
    pub usage_always: Option<bool>,
    /// Which chunks carry `"role": "assistant"`.
    #[arg(long, value_enum)]
    pub role: Option<RolePlacement>,
    /// Which delta field carries the generated text.
    #[arg(long, value_enum)]
    pub content_field: Option<ContentField>,
    /// Send an `{"error": …}` event after this many tokens.
    #[arg(long)]
    pub error_after: Option<u32>,
    /// What follows that error event.
    #[arg(long, value_enum)]
    pub after_error: Option<AfterError>,
    /// The server process dies after this many tokens (connections cut, port closed).
    #[arg(long)]
    pub exit_after: Option<u32>,
    /// Accept the request and never answer it.
    #[arg(long)]
    pub hang: Option<bool>,
    /// Stop sending (connection stays open) after this many tokens.
    #[arg(long)]
    pub hang_after: Option<u32>,
    /// Drop the connection after this many tokens while the process lives on (0: before any
    /// byte of the body).
    #[arg(long)]
    pub drop_after: Option<u32>,
    /// Refuse prompts over this many tokens (a token is a whitespace-separated word here).
    #[arg(long)]
    pub prompt_cap: Option<u32>,
    /// How an over-long prompt is refused.
    #[arg(long, value_enum)]
    pub cap_style: Option<CapStyle>,
    /// Answer every request with this HTTP status and an error body.
    #[arg(long)]
    pub fail_status: Option<u16>,
    /// After this many content frames, wait until `POST /sim/release/{hold_key}`.
    #[arg(long)]
    pub hold_after: Option<u32>,
    /// The name a held request waits on.
    #[arg(long)]
    pub hold_key: Option<String>,
    /// Go on generating (holding the generation slot) after the client leaves, to the end of
    /// the answer (mlx-openai-server).
    #[arg(long)]
    pub keep_generating: Option<bool>,
    /// Say `finish_reason: "stop"` on an answer cut at `max_tokens` (mlx-openai-server,
    /// mlx-omni-server).
    #[arg(long)]
    pub stop_at_max_tokens: Option<bool>,
    /// A stream that arrives while another generates gets 200, a role chunk, an error event and
    /// `[DONE]` (vllm-mlx without `--continuous-batching`).
    #[arg(long)]
    pub busy_event: Option<bool>,
    /// A stream's answer ends in a tool call, carried by its finish chunk (`delta.tool_calls`,
    /// `finish_reason: "tool_calls"`), as mlx-omni-server streams tool calls.
    #[arg(long)]
    pub tool_call: Option<bool>,
    /// Refuse any Host but a loopback one (400 text/plain "Invalid host header") and any
    /// `Origin` (403 "Cross-origin requests disabled"), on every route (Rapid-MLX). Read from the
    /// server's defaults only.
    #[arg(long)]
    pub loopback_only: Option<bool>,
}

/// A real server whose quirks the simulator reproduces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Style {
    /// Plain OpenAI: role in the first chunk, a usage-only chunk when asked.
    Openai,
    /// mlx_lm.server: `: keepalive N/M` comments during prefill, `role` on every delta, usage
    /// chunk with `choices: []`.
    MlxLm,
    /// mlx-openai-server: role-only first chunk, usage always on the finish chunk, `chatcmpl_`
    /// ids, `stop` at max_tokens, generation goes on after the client leaves, an error event
    /// followed by a normal stop and `[DONE]`.
    MlxOpenaiServer,
    /// vllm-mlx: usage on the finish chunk and again in a usage-only chunk.
    VllmMlx,
    /// vllm-mlx in its default "simple mode" (no `--continuous-batching`): as `vllm-mlx`, and a
    /// second concurrent stream gets 200, a role chunk, an error event and `[DONE]`, as does one sent
    /// within 200 ms of a client abort.
    VllmMlxSimple,
    /// Rapid-MLX: keepalive comments, OpenAI-shaped context_length_exceeded, only a loopback
    /// `Host` and no `Origin` accepted.
    RapidMlx,
    /// omlx: a fake `chatcmpl-keepalive` data chunk at once and every interval; a 32768 cap.
    Omlx,
    /// mlx-omni-server: role on every delta, `stop` at max_tokens, the finish chunk sent again
    /// with the usage; an exception ends the stream with no `[DONE]`.
    MlxOmni,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Keepalive {
    None,
    /// SSE comment lines `: keepalive N/M`.
    Comment,
    /// omlx's data chunk with id `chatcmpl-keepalive` and empty content.
    Omlx,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum UsagePlacement {
    Finish,
    Separate,
    Both,
    /// The finish chunk again, with only the role and the usage (mlx-omni-server).
    RepeatFinish,
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum RolePlacement {
    None,
    /// A role-only chunk before the first token.
    First,
    /// `role` on every delta.
    Every,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum ContentField {
    Content,
    ReasoningContent,
    /// The same text in both `reasoning_content` and `reasoning` (mlx-vlm's synced aliases).
    BothReasoning,
    /// No text deltas at all, while usage still counts the tokens.
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum AfterError {
    /// A normal `finish_reason: stop` chunk and `[DONE]` (mlx-openai-server).
    StopAndDone,
    /// The stream just ends (mlx-omni-server).
    End,
}

/// How a server reports its prompt cache in `usage.prompt_tokens_details.cached_tokens`; the
/// simulator's cache is the previous prompt, and a hit is the prefix a new prompt shares with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptCache {
    /// No `prompt_tokens_details` (vllm-mlx, omlx, plain OpenAI here).
    Unreported,
    /// The shared prefix, at most the prompt less its last token, which is always processed
    /// again (mlx_lm.server 0.32.2: 137 of a repeated 138-token prompt; mlx-openai-server,
    /// mlx-omni-server).
    LessLastToken,
    /// The shared prefix, up to the whole prompt (Rapid-MLX: 27 of a repeated 27-token prompt).
    Whole,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum CapStyle {
    /// `Prompt too long: N tokens exceeds max context window of C tokens`, code null.
    Omlx,
    /// OpenAI's `context_length_exceeded`, counting prompt + max_tokens.
    Openai,
    /// `{"detail": …}`.
    Vllm,
    /// llama-server's `exceed_context_size_error`.
    LlamaServer,
}

/// A fully resolved behaviour for one request.
#[derive(Debug, Clone)]
pub struct Plan {
    pub ttft_ms: u64,
    pub prefill_ms_per_token: f64,
    pub tokens_per_second: f64,
    pub tokens: u32,
    pub bytes_per_write: usize,
    pub burst: bool,
    pub keepalive: Keepalive,
    pub keepalive_ms: u64,
    pub usage: UsagePlacement,
    pub usage_always: bool,
    pub role: RolePlacement,
    pub content_field: ContentField,
    pub error_after: Option<u32>,
    pub after_error: AfterError,
    pub exit_after: Option<u32>,
    pub hang: bool,
    pub hang_after: Option<u32>,
    pub drop_after: Option<u32>,
    pub prompt_cap: Option<u32>,
    pub cap_style: CapStyle,
    pub fail_status: Option<u16>,
    pub hold_after: Option<u32>,
    pub hold_key: String,
    pub keep_generating: bool,
    pub stop_at_max_tokens: bool,
    pub busy_event: bool,
    pub tool_call: bool,
    pub loopback_only: bool,
    /// From the style: how the prompt cache is reported.
    pub prompt_cache: PromptCache,
    /// From the style: the id's prefix (`chatcmpl-`, mlx-openai-server's `chatcmpl_`).
    pub id_prefix: &'static str,
}

impl Behaviour {
    /// `self` where set, else `under`.
    pub fn over(&self, under: &Behaviour) -> Behaviour {
        macro_rules! pick {
            ($($f:ident),*) => { Behaviour { $($f: self.$f.clone().or_else(|| under.$f.clone()),)* } };
        }
        pick!(
            style,
            ttft_ms,
            prefill_ms_per_token,
            tokens_per_second,
            tokens,
            bytes_per_write,
            burst,
            keepalive,
            keepalive_ms,
            usage,
            usage_always,
            role,
            content_field,
            error_after,
            after_error,
            exit_after,
            hang,
            hang_after,
            drop_after,
            prompt_cap,
            cap_style,
            fail_status,
            hold_after,
            hold_key,
            keep_generating,
            stop_at_max_tokens,
            busy_event,
            tool_call,
            loopback_only
        )
    }

    /// Resolves the remaining gaps from the style preset and the generic defaults.
    pub fn plan(&self) -> Plan {
        let style = self.style.unwrap_or(Style::Openai);
        let preset = style.preset();
        let b = self.over(&preset);
        Plan {
            ttft_ms: b.ttft_ms.unwrap_or(20),
            prefill_ms_per_token: b.prefill_ms_per_token.filter(|t| t.is_finite() && *t > 0.0).unwrap_or(0.0),
            tokens_per_second: b.tokens_per_second.filter(|t| *t > 0.0).unwrap_or(200.0),
            tokens: b.tokens.unwrap_or(8),
            bytes_per_write: b.bytes_per_write.unwrap_or(0),
            burst: b.burst.unwrap_or(false),
            keepalive: b.keepalive.unwrap_or(Keepalive::None),
            keepalive_ms: b.keepalive_ms.unwrap_or(1000).max(1),
            usage: b.usage.unwrap_or(UsagePlacement::Separate),
            usage_always: b.usage_always.unwrap_or(false),
            role: b.role.unwrap_or(RolePlacement::First),
            content_field: b.content_field.unwrap_or(ContentField::Content),
            error_after: b.error_after,
            after_error: b.after_error.unwrap_or(AfterError::End),
            exit_after: b.exit_after,
            hang: b.hang.unwrap_or(false),
            hang_after: b.hang_after,
            drop_after: b.drop_after,
            prompt_cap: b.prompt_cap,
            cap_style: b.cap_style.unwrap_or(CapStyle::Openai),
            fail_status: b.fail_status,
            hold_after: b.hold_after,
            hold_key: b.hold_key.unwrap_or_default(),
            keep_generating: b.keep_generating.unwrap_or(false),
            stop_at_max_tokens: b.stop_at_max_tokens.unwrap_or(false),
            busy_event: b.busy_event.unwrap_or(false),
            tool_call: b.tool_call.unwrap_or(false),
            loopback_only: b.loopback_only.unwrap_or(false),
            prompt_cache: style.prompt_cache(),
            id_prefix: if style == Style::MlxOpenaiServer { "chatcmpl_" } else { "chatcmpl-" },
        }
    }
}

impl Style {
    /// How this server reports its prompt cache (wire facts, measured on the tiny model).
    fn prompt_cache(self) -> PromptCache {
        match self {
            Style::MlxLm | Style::MlxOpenaiServer | Style::MlxOmni => PromptCache::LessLastToken,
            Style::RapidMlx => PromptCache::Whole,
            Style::Openai | Style::VllmMlx | Style::VllmMlxSimple | Style::Omlx => PromptCache::Unreported,
        }
    }

    /// The knobs that make the simulator behave like this server.
    fn preset(self) -> Behaviour {
        let mut b = Behaviour::default();
        match self {
            Style::Openai => {}
            Style::MlxLm => {
                b.keepalive = Some(Keepalive::Comment);
                b.usage = Some(UsagePlacement::Separate);
                // Measured: every delta, the finish chunk's too, carries "role": "assistant".
                b.role = Some(RolePlacement::Every);
            }
            Style::MlxOpenaiServer => {
                b.role = Some(RolePlacement::First);
                b.usage = Some(UsagePlacement::Finish);
                b.usage_always = Some(true);
                b.after_error = Some(AfterError::StopAndDone);
                b.stop_at_max_tokens = Some(true);
                b.keep_generating = Some(true);
            }
            Style::VllmMlx => {
                b.usage = Some(UsagePlacement::Both);
            }
            Style::VllmMlxSimple => {
                b.usage = Some(UsagePlacement::Both);
                b.busy_event = Some(true);
            }
            Style::RapidMlx => {
                b.keepalive = Some(Keepalive::Comment);
                b.cap_style = Some(CapStyle::Openai);
                b.usage = Some(UsagePlacement::Finish);
                b.loopback_only = Some(true);
            }
            Style::Omlx => {
                b.keepalive = Some(Keepalive::Omlx);
                b.keepalive_ms = Some(10_000);
                b.prompt_cap = Some(32_768);
                b.cap_style = Some(CapStyle::Omlx);
                b.usage = Some(UsagePlacement::Finish);
            }
            Style::MlxOmni => {
                b.role = Some(RolePlacement::Every);
                b.usage = Some(UsagePlacement::RepeatFinish);
                b.after_error = Some(AfterError::End);
                b.stop_at_max_tokens = Some(true);
            }
        }
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_overrides_flags_which_override_the_style() {
        let flags = Behaviour { style: Some(Style::Omlx), tokens: Some(3), ..Default::default() };
        let request: Behaviour = serde_json::from_str(r#"{"tokens": 5, "keepalive": "comment"}"#).expect("json");
        let plan = request.over(&flags).plan();
        assert_eq!(plan.tokens, 5);
        assert_eq!(plan.keepalive, Keepalive::Comment);
        assert_eq!(plan.prompt_cap, Some(32_768));
        assert_eq!(plan.cap_style, CapStyle::Omlx);
    }

    #[test]
    fn unknown_request_knob_is_refused() {
        assert!(serde_json::from_str::<Behaviour>(r#"{"tokenz": 5}"#).is_err());
    }
}
