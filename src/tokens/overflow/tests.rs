//! Tests of the overflow plans: `middle_out`, `chunk` and the room rules, over fixed
//! conversations and generated ones (proptest), with a fake tokenizer.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use serde_json::{Value, json};

use super::chunk::{MAX_OVERLAP, piece_ranges};
use super::cut::{MAX_BOUNDARY_SHIFT, cut_middle};
use super::messages::{is_instruction, role, text_only, text_segments, tool_call_text};
use super::middle_out::{MIN_KEPT_TOKENS, last_user};
use super::*;

/// Template tokens per message, for the generation prompt, per tool, per image, and the
/// BOS a text prompt gets.
const PER_MESSAGE: usize = 4;
const GENERATION_PROMPT: usize = 3;
const PER_TOOL: usize = 20;
const PER_IMAGE: usize = 10;
const BOS: usize = 1;

/// A fake tokenizer: a token is a word with the whitespace before it (so decoding is
/// concatenation and `decode(encode(t)) == t`); a chat prompt is its texts plus fixed
/// overheads. Strict like a real template/server: a tool answer without its call, or a
/// call without all its answers, is an error.
#[derive(Default)]
struct Words {
    vocabulary: Mutex<(HashMap<String, u32>, Vec<String>)>,
    chat_counts: AtomicUsize,
}

fn words(text: &str) -> Vec<&str> {
    let mut tokens = Vec::new();
    let mut start = 0;
    let mut previous_blank = true;
    for (index, c) in text.char_indices() {
        if !c.is_whitespace() && previous_blank && index > 0 && !text[start..index].trim().is_empty() {
            tokens.push(&text[start..index]);
            start = index;
        }
        previous_blank = c.is_whitespace();
    }
    if start < text.len() {
        tokens.push(&text[start..]);
    }
    tokens
}

impl Count for Words {
    fn chat_tokens(&self, prompt: ChatPrompt<'_>) -> Result<usize, CountError> {
        self.chat_counts.fetch_add(1, Ordering::Relaxed);
        let mut tokens = GENERATION_PROMPT + prompt.tools.map_or(0, |t| t.len() * PER_TOOL);
        let mut open_calls: Vec<String> = Vec::new();
        for message in prompt.messages {
            let call_ids = |m: &Value| -> Vec<String> {
                m.get("tool_calls")
                    .and_then(Value::as_array)
                    .map(|calls| calls.iter().filter_map(|c| c["id"].as_str().map(String::from)).collect())
                    .unwrap_or_default()
            };
            if role(message) == "tool" {
                let id = message["tool_call_id"].as_str().unwrap_or("");
                let Some(at) = open_calls.iter().position(|c| c == id) else {
                    return Err(CountError::Template(format!("tool answer {id} without its call")));
                };
                open_calls.remove(at);
            } else if !open_calls.is_empty() {
                return Err(CountError::Template(format!("calls {open_calls:?} not answered")));
            }
            open_calls.extend(call_ids(message));
            tokens += PER_MESSAGE;
            tokens += text_segments(message).iter().map(|(_, t)| words(t).len()).sum::<usize>();
            tokens += tool_call_text(message).map_or(0, |t| words(&t).len());
            if let Some(Value::Array(parts)) = message.get("content") {
                tokens += PER_IMAGE * parts.iter().filter(|p| p["type"] == "image_url").count();
            }
        }
        Ok(tokens)
    }
    fn text_tokens(&self, text: &str) -> usize {
        BOS + words(text).len()
    }
    fn encode(&self, text: &str) -> Vec<u32> {
        let mut vocabulary = self.vocabulary.lock().unwrap();
        let (ids, strings) = &mut *vocabulary;
        words(text)
            .into_iter()
            .map(|word| {
                *ids.entry(word.to_string()).or_insert_with(|| {
                    strings.push(word.to_string());
                    strings.len() as u32 - 1
                })
            })
            .collect()
    }
    fn decode(&self, ids: &[u32]) -> String {
        let vocabulary = self.vocabulary.lock().unwrap();
        ids.iter().map(|id| vocabulary.1[*id as usize].as_str()).collect()
    }
    fn exact(&self) -> bool {
        true
    }
}

/// A byte-level fake: one token per byte, decoded lossily (like a byte-level BPE cut
/// inside a character).
struct Bytes;

impl Count for Bytes {
    fn chat_tokens(&self, prompt: ChatPrompt<'_>) -> Result<usize, CountError> {
        Ok(prompt.messages.iter().map(|m| PER_MESSAGE + m["content"].as_str().unwrap_or("").len()).sum())
    }
    fn text_tokens(&self, text: &str) -> usize {
        text.len()
    }
    fn encode(&self, text: &str) -> Vec<u32> {
        text.bytes().map(u32::from).collect()
    }
    fn decode(&self, ids: &[u32]) -> String {
        String::from_utf8_lossy(&ids.iter().map(|b| *b as u8).collect::<Vec<_>>()).into_owned()
    }
    fn exact(&self) -> bool {
        true
    }
}

fn text(tag: &str, n: usize) -> String {
    (0..n).map(|i| format!("{tag}{i}")).collect::<Vec<_>>().join(" ")
}

fn msg(role: &str, content: String) -> Value {
    json!({"role": role, "content": content})
}

fn chat(messages: &[Value]) -> ChatPrompt<'_> {
    ChatPrompt { messages, tools: None, template_kwargs: None }
}

/// A budget that needs 1 token of room (the smallest `min_room`).
fn budget(cap: usize, max_tokens: Option<usize>) -> Budget {
    Budget { cap, max_tokens, min_room: 1 }
}

fn budget_room(cap: usize, max_tokens: Option<usize>, min_room: usize) -> Budget {
    Budget { cap, max_tokens, min_room }
}

fn count(counter: &Words, messages: &[Value]) -> usize {
    counter.chat_tokens(chat(messages)).unwrap()
}

#[test]
fn fits_up_to_the_cap_with_max_tokens_and_cuts_max_tokens_to_the_room_left_beyond() {
    let counter = Words::default();
    let messages = [msg("user", text("u", 10))];
    let prompt = count(&counter, &messages);
    assert_eq!(prompt, 10 + PER_MESSAGE + GENERATION_PROMPT);
    for action in [OnOverflow::Reject, OnOverflow::MiddleOut, OnOverflow::Chunk] {
        let fits = plan_chat(&counter, chat(&messages), budget(prompt + 50, Some(50)), action).unwrap();
        assert_eq!(fits, ChatPlan::Fits { prompt_tokens: prompt, max_tokens: 50 });
        // One over: the answer gets the room left, whatever the action (no transform).
        let cut = plan_chat(&counter, chat(&messages), budget_room(prompt + 49, Some(50), 49), action).unwrap();
        assert_eq!(cut, ChatPlan::Fits { prompt_tokens: prompt, max_tokens: 49 });
        // OpenCode's `max_tokens: 32000` on a 32k model.
        let agent = plan_chat(&counter, chat(&messages), budget_room(prompt + 1000, Some(32000), 256), action);
        assert_eq!(agent.unwrap(), ChatPlan::Fits { prompt_tokens: prompt, max_tokens: 1000 });
    }
    // Less than min_room left: over the cap, the completion counted in the refusal.
    // (min_room is at most half the cap: 13 here.)
    let over = plan_chat(&counter, chat(&messages), budget_room(prompt + 10, Some(50), 50), OnOverflow::Reject);
    assert_eq!(over.unwrap(), ChatPlan::Reject(Requested { prompt, completion: Some(50) }));
    // A client asking for fewer tokens than min_room needs only those.
    let small = plan_chat(&counter, chat(&messages), budget_room(prompt + 10, Some(10), 256), OnOverflow::Reject);
    assert_eq!(small.unwrap(), ChatPlan::Fits { prompt_tokens: prompt, max_tokens: 10 });
}

#[test]
fn min_room_is_at_most_half_the_cap_and_at_least_one() {
    assert_eq!(budget_room(100, None, 256).needed(), 50);
    assert_eq!(budget_room(32768, None, 256).needed(), 256);
    assert_eq!(budget_room(32768, Some(100), 256).needed(), 100);
    assert_eq!(budget_room(1, None, 256).needed(), 1);
    assert_eq!(budget_room(32768, Some(0), 256).needed(), 1);
    // A transform makes room for what an answer is likely to need, not for max_tokens.
    assert_eq!(budget_room(32768, Some(32000), 256).reserve(), 1024);
    assert_eq!(budget_room(32768, Some(500), 256).reserve(), 500);
    assert_eq!(budget_room(2048, None, 256).reserve(), 512);
    assert_eq!(budget_room(2048, None, 900).reserve(), 900);
}

#[test]
fn without_max_tokens_the_plan_gives_the_room_left_and_a_full_prompt_is_rejected() {
    let counter = Words::default();
    let messages = [msg("user", text("u", 10))];
    let prompt = count(&counter, &messages);
    let fits = plan_chat(&counter, chat(&messages), budget(prompt + 1, None), OnOverflow::Reject).unwrap();
    assert_eq!(fits, ChatPlan::Fits { prompt_tokens: prompt, max_tokens: 1 });
    let full = plan_chat(&counter, chat(&messages), budget(prompt, None), OnOverflow::Reject).unwrap();
    assert_eq!(full, ChatPlan::Reject(Requested { prompt, completion: Some(1) }));
    let over = plan_chat(&counter, chat(&messages), budget(prompt - 1, None), OnOverflow::Reject).unwrap();
    assert_eq!(over, ChatPlan::Reject(Requested { prompt, completion: None }));
}

#[test]
fn max_tokens_alone_at_the_cap_is_cut_to_the_room_left_whatever_the_action() {
    let counter = Words::default();
    let messages = [msg("user", "hi".into())];
    let prompt = count(&counter, &messages);
    for action in [OnOverflow::Reject, OnOverflow::MiddleOut, OnOverflow::Chunk] {
        let plan = plan_chat(&counter, chat(&messages), budget_room(100, Some(100), 20), action).unwrap();
        assert_eq!(plan, ChatPlan::Fits { prompt_tokens: prompt, max_tokens: 100 - prompt });
        let text = plan_text(&counter, "hi", budget_room(100, Some(100), 20), action);
        assert_eq!(text, TextPlan::Fits { prompt_tokens: 1 + BOS, max_tokens: 100 - 1 - BOS });
    }
}

#[test]
fn middle_out_removes_the_oldest_exchange_first_and_keeps_the_rest_whole() {
    let counter = Words::default();
    let messages = [
        msg("system", text("s", 20)),
        msg("user", text("first", 20)),
        msg("assistant", text("a1", 100)),
        msg("user", text("u2", 100)),
        msg("assistant", text("a2", 100)),
        msg("user", text("last", 20)),
    ];
    let original = count(&counter, &messages);
    // Room for everything but about 150 tokens: the (a1, u2) exchange goes, nothing is cut.
    let cap = original - 150 + 50;
    let plan = plan_chat(&counter, chat(&messages), budget(cap, Some(50)), OnOverflow::MiddleOut).unwrap();
    let expected = vec![messages[0].clone(), messages[1].clone(), messages[4].clone(), messages[5].clone()];
    let final_tokens = count(&counter, &expected);
    assert_eq!(
        plan,
        ChatPlan::MiddleOut {
            messages: expected,
            prompt_tokens: final_tokens,
            removed_tokens: original - final_tokens,
            max_tokens: 50,
        }
    );
}

#[test]
fn middle_out_removes_a_tool_call_with_its_answers() {
    let counter = Words::default();
    let call = |id: &str| json!({"id": id, "type": "function", "function": {"name": "read", "arguments": "{\"path\": \"a\"}"}});
    let messages = [
        msg("user", text("first", 10)),
        json!({"role": "assistant", "content": null, "tool_calls": [call("c1"), call("c2")]}),
        json!({"role": "tool", "tool_call_id": "c1", "content": text("r1", 200)}),
        json!({"role": "tool", "tool_call_id": "c2", "content": text("r2", 200)}),
        msg("assistant", text("a", 10)),
        msg("user", text("last", 10)),
    ];
    let original = count(&counter, &messages);
    let plan = plan_chat(&counter, chat(&messages), budget(original - 250, None), OnOverflow::MiddleOut).unwrap();
    let ChatPlan::MiddleOut { messages: kept, .. } = plan else {
        panic!("expected middle-out, got {plan:?}");
    };
    assert_eq!(kept, vec![messages[0].clone(), messages[4].clone(), messages[5].clone()]);
}

#[test]
fn middle_out_cuts_the_middle_of_the_longest_text_but_never_the_system_message() {
    let counter = Words::default();
    let messages = [
        msg("system", text("s", 300)),
        msg("user", text("doc", 1000)),
        msg("assistant", text("a", 30)),
        msg("user", text("last", 20)),
    ];
    let plan = plan_chat(&counter, chat(&messages), budget(600, Some(100)), OnOverflow::MiddleOut).unwrap();
    let ChatPlan::MiddleOut { messages: kept, prompt_tokens, max_tokens, .. } = plan else {
        panic!("expected middle-out, got {plan:?}");
    };
    assert!(prompt_tokens + max_tokens <= 600);
    assert_eq!(kept.len(), 3, "the assistant message goes before any cut: {kept:?}");
    assert_eq!(kept[0], messages[0]);
    assert_eq!(kept[2], messages[3]);
    let cut = kept[1]["content"].as_str().unwrap();
    assert!(cut.starts_with("doc0 doc1 doc2") && cut.ends_with("doc998 doc999"), "{cut}");
    assert!(cut.contains(CUT_MARKER));
}

#[test]
fn middle_out_rejects_when_the_system_message_alone_is_over() {
    let counter = Words::default();
    let messages = [msg("system", text("s", 500)), msg("user", text("u", 500))];
    let plan = plan_chat(&counter, chat(&messages), budget(400, Some(10)), OnOverflow::MiddleOut).unwrap();
    assert_eq!(plan, ChatPlan::Reject(Requested { prompt: count(&counter, &messages), completion: None }));
}

#[test]
fn middle_out_never_cuts_an_image_part() {
    let counter = Words::default();
    let image = json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}});
    let messages = [json!({"role": "user", "content": [
        {"type": "text", "text": text("t", 800)}, image.clone(), {"type": "text", "text": "what is it?"}
    ]})];
    let plan = plan_chat(&counter, chat(&messages), budget(300, Some(50)), OnOverflow::MiddleOut).unwrap();
    let ChatPlan::MiddleOut { messages: kept, .. } = plan else {
        panic!("expected middle-out, got {plan:?}");
    };
    let parts = kept[0]["content"].as_array().unwrap();
    assert_eq!(parts[1], image);
    assert_eq!(parts[2]["text"], "what is it?");
    assert!(parts[0]["text"].as_str().unwrap().contains(CUT_MARKER));
}

#[test]
fn middle_out_counts_the_whole_prompt_twice_at_most_when_the_estimate_holds() {
    let counter = Words::default();
    let mut messages = vec![msg("system", text("s", 100)), msg("user", text("first", 100))];
    for turn in 0..200 {
        messages.push(msg("assistant", text(&format!("a{turn}x"), 200)));
        messages.push(msg("user", text(&format!("u{turn}x"), 100)));
    }
    let plan = plan_chat(&counter, chat(&messages), budget(8000, Some(500)), OnOverflow::MiddleOut).unwrap();
    assert!(matches!(plan, ChatPlan::MiddleOut { .. }), "{plan:?}");
    assert_eq!(counter.chat_counts.load(Ordering::Relaxed), 2, "the first count and one verification");
}

fn chunk_plan(counter: &Words, messages: &[Value], budget: Budget) -> ChunkPlan {
    match plan_chat(counter, chat(messages), budget, OnOverflow::Chunk).unwrap() {
        ChatPlan::Chunk(plan) => plan,
        other => panic!("expected chunk, got {other:?}"),
    }
}

#[test]
fn chunk_splits_the_last_message_into_map_requests_and_the_reduce_fits() {
    let counter = Words::default();
    let document = format!("Summarise this log. {}", text("line", 5000));
    let messages = [
        msg("system", text("s", 50)),
        msg("user", text("old", 300)),
        msg("assistant", "ok".into()),
        msg("user", document.clone()),
    ];
    let plan = chunk_plan(&counter, &messages, budget(1000, Some(200)));
    let planning_counts = counter.chat_counts.load(Ordering::Relaxed);
    check_chunk(&counter, &messages, None, budget(1000, Some(200)), &plan);
    assert_eq!(plan.reduce_max_tokens, 200);
    assert!(plan.len() >= 6, "{} pieces", plan.len());
    let first = plan.pieces[0].messages[1]["content"].as_str().unwrap();
    assert!(first.starts_with(&format!("A long message was split into {} parts.", plan.len())), "{first}");
    assert!(first.contains(&format!("Part 1 of {} of the text it refers to:\n", plan.len())), "{first}");
    assert!(first.ends_with(&plan.pieces[0].text));
    for piece in &plan.pieces {
        assert_eq!(piece.messages[0], messages[0], "the instructions go with each piece");
        assert_eq!(piece.messages.len(), 2, "the earlier conversation does not");
    }
    let reduce = plan.reduce_messages(&["one".into(), "two".into()]);
    let reduce = reduce[1]["content"].as_str().unwrap();
    assert!(reduce.contains("Summarise this log.") && reduce.contains("[Part 2 of"), "{reduce}");
    println!(
        "chunk: {} pieces, map max_tokens {}, {planning_counts} counts while planning",
        plan.len(),
        plan.map_max_tokens
    );
}

#[test]
fn chunk_behaves_as_middle_out_when_the_last_message_fits_with_the_instructions() {
    let counter = Words::default();
    let messages = [
        msg("system", text("s", 50)),
        msg("user", text("old", 2000)),
        msg("assistant", "ok".into()),
        msg("user", text("q", 100)),
    ];
    let plan = plan_chat(&counter, chat(&messages), budget(1000, Some(200)), OnOverflow::Chunk).unwrap();
    assert!(matches!(plan, ChatPlan::MiddleOut { .. }), "{plan:?}");
}

#[test]
fn chunk_rejects_when_partial_answers_would_get_too_few_tokens() {
    let counter = Words::default();
    let messages = [msg("user", text("doc", 20_000))];
    // 500 tokens kept for the client's answer (min_room 600, at most half the cap) leave too
    // little for dozens of partial answers.
    let budget = budget_room(1000, Some(600), 600);
    assert_eq!(budget.reserve(), 500);
    let plan = plan_chat(&counter, chat(&messages), budget, OnOverflow::Chunk).unwrap();
    assert_eq!(plan, ChatPlan::Reject(Requested { prompt: count(&counter, &messages), completion: None }));
}

/// Review issue 1: a `<doc>…</doc> QUESTION: …` message split in pieces; every map request
/// and the reduce request must carry the question at its end, and the reduce request the
/// turns before the long message that fit.
#[test]
fn chunk_carries_the_request_into_every_map_request_and_the_reduce_with_the_recent_turns() {
    let counter = Words::default();
    let question = "QUESTION: which region grew fastest?";
    let document = format!("<doc> {} </doc>\n{question}", text("report", 6000));
    let messages = [
        msg("system", "You are helpful.".into()),
        msg("user", text("old", 400)),
        msg("assistant", text("oldanswer", 400)),
        msg("user", "Now the quarterly report.".into()),
        msg("assistant", "Send it.".into()),
        msg("user", document.clone()),
    ];
    let budget = budget(2000, Some(300));
    let plan = chunk_plan(&counter, &messages, budget);
    check_chunk(&counter, &messages, None, budget, &plan);
    assert!(plan.len() >= 3, "{} pieces", plan.len());
    for piece in &plan.pieces {
        let map = piece.messages[1]["content"].as_str().unwrap();
        assert!(map.contains(question) && map.contains("<doc> report0 report1"), "{map}");
    }
    let reduce = plan.reduce_messages(&vec!["x".into(); plan.len()]);
    let reduce_text = reduce.last().unwrap()["content"].as_str().unwrap();
    assert!(reduce_text.contains(question) && reduce_text.contains("[Part 3 of"), "{reduce_text}");
    // The last exchange fits in a quarter of the reduce room; the 800-token one before does not.
    assert_eq!(reduce[..reduce.len() - 1], [messages[0].clone(), messages[3].clone(), messages[4].clone()]);
}

/// Review issue 2: five tokens over, the latest user instruction ("STOP") must stay and
/// the 2.7k-token tool answer be cut instead.
#[test]
fn middle_out_cuts_a_long_tool_answer_rather_than_remove_the_latest_user_instruction() {
    let counter = Words::default();
    let call = json!({"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}});
    let messages = [
        msg("system", "sys".into()),
        msg("user", "task: refactor the module".into()),
        msg("assistant", "done with step one".into()),
        msg("user", "STOP. Do not touch the tests; revert instead.".into()),
        json!({"role": "assistant", "content": "", "tool_calls": [call]}),
        json!({"role": "tool", "tool_call_id": "c1", "content": text("lorem", 2700)}),
    ];
    let total = count(&counter, &messages);
    let plan =
        plan_chat(&counter, chat(&messages), budget_room(total - 5 + 100, Some(100), 100), OnOverflow::MiddleOut)
            .unwrap();
    let ChatPlan::MiddleOut { messages: kept, prompt_tokens, removed_tokens, .. } = plan else {
        panic!("expected middle-out, got {plan:?}");
    };
    assert_eq!(kept[..5], messages[..5], "nothing removed: the excess is cut from the tool answer");
    assert!(kept[5]["content"].as_str().unwrap().contains(CUT_MARKER));
    assert!(prompt_tokens + 100 <= total - 5 + 100 && removed_tokens < 20, "removed {removed_tokens}");
    // A large excess removes groups, but never the last user message.
    let plan = plan_chat(&counter, chat(&messages), budget(1200, Some(100)), OnOverflow::MiddleOut).unwrap();
    let ChatPlan::MiddleOut { messages: kept, .. } = plan else {
        panic!("expected middle-out, got {plan:?}");
    };
    assert!(!kept.contains(&messages[2]) && kept.contains(&messages[3]), "{kept:?}");
}

#[test]
fn middle_out_cuts_the_last_user_message_only_after_every_other_text() {
    let counter = Words::default();
    let messages = [msg("user", text("doc", 600)), msg("assistant", text("a", 30)), msg("user", text("ask", 1000))];
    let plan = plan_chat(&counter, chat(&messages), budget(800, Some(50)), OnOverflow::MiddleOut).unwrap();
    let ChatPlan::MiddleOut { messages: kept, prompt_tokens, .. } = plan else {
        panic!("expected middle-out, got {plan:?}");
    };
    assert!(prompt_tokens + 50 <= 800);
    assert_eq!(kept.len(), 2, "the assistant message goes first: {kept:?}");
    let doc = kept[0]["content"].as_str().unwrap();
    let ask = kept[1]["content"].as_str().unwrap();
    assert!(words(doc).len() <= MIN_KEPT_TOKENS + 2, "the first message is cut to its minimum first: {doc}");
    assert!(ask.starts_with("ask0 ") && ask.ends_with(" ask999") && ask.contains(CUT_MARKER));
    assert!(words(ask).len() > 600, "the last user message keeps all the room left: {}", words(ask).len());
}

/// Review issue 3: a prompt just under the cap must not go out with `max_tokens: 1`: less
/// than `min_room` left is over the cap, and a transform makes room for the reserve.
#[test]
fn a_prompt_that_leaves_less_than_min_room_is_transformed_to_make_room_for_the_reserve() {
    let counter = Words::default();
    let messages = [msg("user", text("lorem", 500))];
    let total = count(&counter, &messages);
    for max_tokens in [None, Some(32000)] {
        let budget = budget_room(total + 1, max_tokens, 256);
        let reserve = budget.reserve();
        assert!(reserve > 100);
        match plan_chat(&counter, chat(&messages), budget, OnOverflow::MiddleOut).unwrap() {
            ChatPlan::MiddleOut { prompt_tokens, max_tokens, .. } => {
                assert!(max_tokens >= reserve && prompt_tokens + max_tokens <= total + 1, "{max_tokens}");
            }
            other => panic!("expected middle-out, got {other:?}"),
        }
        match plan_chat(&counter, chat(&messages), budget, OnOverflow::Chunk).unwrap() {
            ChatPlan::Chunk(plan) => {
                check_chunk(&counter, &messages, None, budget, &plan);
                assert!(plan.reduce_max_tokens >= reserve);
            }
            other => panic!("expected chunk, got {other:?}"),
        }
        match plan_text(&counter, &text("lorem", 500), budget_room(500 + BOS + 1, max_tokens, 256), OnOverflow::Chunk) {
            TextPlan::MiddleOut { max_tokens, .. } => assert!(max_tokens >= 125, "{max_tokens}"),
            other => panic!("expected middle-out, got {other:?}"),
        }
        // Reject models refuse it, the room kept for the answer counted.
        let completion = Some(max_tokens.unwrap_or(budget.needed()));
        assert_eq!(
            plan_chat(&counter, chat(&messages), budget, OnOverflow::Reject).unwrap(),
            ChatPlan::Reject(Requested { prompt: total, completion })
        );
    }
    // With min_room 1, the one token left is room enough: sent as it is.
    let fits = ChatPlan::Fits { prompt_tokens: total, max_tokens: 1 };
    assert_eq!(plan_chat(&counter, chat(&messages), budget(total + 1, None), OnOverflow::MiddleOut).unwrap(), fits);
    // A transform that can not make room (the system message is what is long): refused.
    let instructions = [msg("system", text("s", 500)), msg("user", "hi".into())];
    let total = count(&counter, &instructions);
    let budget = budget_room(total + 10, None, 256);
    let plan = plan_chat(&counter, chat(&instructions), budget, OnOverflow::MiddleOut);
    assert_eq!(plan.unwrap(), ChatPlan::Reject(Requested { prompt: total, completion: Some(budget.needed()) }));
}

/// Review issues 4 and 5: a client's `max_tokens: u64::MAX` (or a huge cap) must not
/// overflow.
#[test]
fn huge_numbers_never_overflow_whatever_the_action() {
    let counter = Words::default();
    let messages = [msg("system", text("s", 10)), msg("user", text("u", 300))];
    let total = count(&counter, &messages);
    let prompt = text("w", 300);
    for action in [OnOverflow::Reject, OnOverflow::MiddleOut, OnOverflow::Chunk] {
        let huge = budget(32768, Some(usize::MAX));
        assert_eq!(
            plan_chat(&counter, chat(&messages), huge, action).unwrap(),
            ChatPlan::Fits { prompt_tokens: total, max_tokens: 32768 - total }
        );
        assert_eq!(
            plan_text(&counter, &prompt, huge, action),
            TextPlan::Fits { prompt_tokens: 300 + BOS, max_tokens: 32768 - 300 - BOS }
        );
        // prompt + max_tokens overflows usize: the room left, never a wrapped sum.
        let almost = budget(usize::MAX, Some(usize::MAX - 1));
        assert_eq!(
            plan_chat(&counter, chat(&messages), almost, action).unwrap(),
            ChatPlan::Fits { prompt_tokens: total, max_tokens: usize::MAX - total }
        );
        assert_eq!(
            plan_text(&counter, &prompt, almost, action),
            TextPlan::Fits { prompt_tokens: 300 + BOS, max_tokens: usize::MAX - 300 - BOS }
        );
        // Refused, the completion's u64::MAX saturates the total.
        let full = budget_room(total + 10, Some(usize::MAX), 20);
        let Ok(ChatPlan::Reject(requested)) = plan_chat(&counter, chat(&messages), full, OnOverflow::Reject) else {
            panic!("expected a refusal");
        };
        assert_eq!(requested.total(), usize::MAX);
        let open = budget(usize::MAX, None);
        let plan = plan_chat(&counter, chat(&messages), open, action).unwrap();
        assert_eq!(plan, ChatPlan::Fits { prompt_tokens: total, max_tokens: usize::MAX - total });
        let plan = plan_text(&counter, &prompt, open, action);
        assert_eq!(plan, TextPlan::Fits { prompt_tokens: 300 + BOS, max_tokens: usize::MAX - 300 - BOS });
        let plan = plan_chat(&counter, chat(&messages), budget(usize::MAX, Some(usize::MAX / 2)), action).unwrap();
        assert_eq!(plan, ChatPlan::Fits { prompt_tokens: total, max_tokens: usize::MAX / 2 });
    }
    assert_eq!(split_for_embedding(&counter, &prompt, usize::MAX), vec![(prompt.clone(), 300)]);
}

#[test]
fn text_prompts_fit_reject_or_middle_out_and_chunk_middle_outs() {
    let counter = Words::default();
    let prompt = text("w", 1000);
    assert_eq!(
        plan_text(&counter, &prompt, budget(2000, Some(10)), OnOverflow::Reject),
        TextPlan::Fits { prompt_tokens: 1000 + BOS, max_tokens: 10 }
    );
    assert_eq!(
        plan_text(&counter, &prompt, budget(500, Some(10)), OnOverflow::Reject),
        TextPlan::Reject(Requested { prompt: 1000 + BOS, completion: None })
    );
    for action in [OnOverflow::MiddleOut, OnOverflow::Chunk] {
        let TextPlan::MiddleOut { text, prompt_tokens, removed_tokens, max_tokens } =
            plan_text(&counter, &prompt, budget(500, Some(10)), action)
        else {
            panic!("expected middle-out");
        };
        assert_eq!(counter.text_tokens(&text), prompt_tokens);
        assert_eq!(prompt_tokens + removed_tokens, 1000 + BOS);
        assert_eq!(prompt_tokens + max_tokens, 500, "nothing is cut beyond what the cap needs");
        assert!(text.starts_with("w0 w1 ") && text.ends_with(" w998 w999"));
    }
}

#[test]
fn embedding_inputs_split_into_pieces_that_fit_and_rebuild_the_text() {
    let counter = Words::default();
    let input = text("e", 1000);
    let pieces = split_for_embedding(&counter, &input, 300);
    assert_eq!(pieces.len(), 4);
    assert!(pieces.iter().all(|(piece, _)| counter.text_tokens(piece) <= 300));
    assert_eq!(pieces.iter().map(|(p, _)| p.as_str()).collect::<String>(), input);
    assert_eq!(pieces.iter().map(|(_, n)| n).sum::<usize>(), 1000);
    assert_eq!(split_for_embedding(&counter, "short one", 300), vec![("short one".to_string(), 2)]);
}

#[test]
fn embeddings_average_by_tokens_and_stay_unit_length_when_the_pieces_are() {
    let unit = average_embeddings(&[(vec![1.0, 0.0], 3), (vec![0.0, 1.0], 1)]);
    let length = (unit[0] * unit[0] + unit[1] * unit[1]).sqrt();
    assert!((length - 1.0).abs() < 1e-6 && (unit[0] / unit[1] - 3.0).abs() < 1e-5, "{unit:?}");
    let plain = average_embeddings(&[(vec![2.0, 0.0], 3), (vec![0.0, 4.0], 1)]);
    assert_eq!(plain, vec![1.5, 1.0]);
    assert!(average_embeddings(&[]).is_empty());
}

#[test]
fn a_cut_never_splits_a_character() {
    let ids = Bytes.encode(&"é".repeat(100));
    for keep in 2..40 {
        let (cut, kept) = cut_middle(&Bytes, &ids, keep);
        assert!(!cut.contains('\u{FFFD}'), "keep {keep}: {cut}");
        assert!(kept <= keep && kept + 2 >= keep, "keep {keep} kept {kept}");
    }
    for len in 2..9 {
        assert!(piece_ranges(&Bytes, &ids, len, 1).iter().all(|r| !Bytes.decode(&ids[r.clone()]).contains('\u{FFFD}')));
    }
}

/// The chunk plan's promises, per the counter.
fn check_chunk(counter: &Words, messages: &[Value], tools: Option<&[Value]>, budget: Budget, plan: &ChunkPlan) {
    let last = messages.last().unwrap();
    let ids = counter.encode(&text_only(last).unwrap());
    assert!(plan.map_max_tokens >= MIN_PARTIAL_TOKENS);
    let instructions: Vec<&Value> = messages.iter().filter(|m| is_instruction(m)).collect();
    let mut rebuilt = Vec::new();
    for piece in &plan.pieces {
        let tokens = count(counter, &piece.messages);
        assert_eq!(tokens, piece.prompt_tokens);
        assert!(tokens + plan.map_max_tokens <= budget.cap, "map prompt {tokens} + {}", plan.map_max_tokens);
        assert_eq!(counter.encode(&piece.text), ids[piece.tokens.clone()]);
        assert_eq!(piece.messages.iter().take(instructions.len()).collect::<Vec<_>>(), instructions);
        let start = piece.tokens.start;
        assert!(start <= rebuilt.len(), "a gap before {start}");
        let overlap = rebuilt.len() - start;
        assert!(overlap <= MAX_OVERLAP + MAX_BOUNDARY_SHIFT);
        rebuilt.extend_from_slice(&ids[piece.tokens.start + overlap..piece.tokens.end]);
    }
    assert_eq!(rebuilt, ids, "pieces minus overlaps re-create the message");
    // The request: the message's head and tail, never the whole message, in every request.
    if let Some((head, tail)) = plan.request.split_once(CUT_MARKER) {
        let message = text_only(last).unwrap();
        assert!(message.starts_with(head) && message.ends_with(tail) && !head.is_empty() && !tail.is_empty());
        assert!(counter.encode(head).len() + counter.encode(tail).len() < ids.len());
        for piece in &plan.pieces {
            assert!(piece.messages.last().unwrap()["content"].as_str().unwrap().contains(&plan.request));
        }
    } else {
        assert!(plan.request.is_empty());
    }
    let partial = text("p", plan.map_max_tokens);
    let reduce = plan.reduce_messages(&vec![partial; plan.len()]);
    let (reduce_user, context) = reduce.split_last().unwrap();
    assert!(reduce_user["content"].as_str().unwrap().contains(&plan.request));
    // The reduce context: every instruction, then a suffix of the earlier conversation.
    let earlier = &messages[..messages.len() - 1];
    let kept: Vec<usize> =
        context.iter().map(|m| earlier.iter().position(|e| e == m).expect("an earlier message")).collect();
    assert!(kept.windows(2).all(|w| w[0] < w[1]), "order kept: {kept:?}");
    let oldest_turn = kept.iter().copied().find(|i| !is_instruction(&earlier[*i])).unwrap_or(earlier.len());
    let expected: Vec<usize> =
        (0..earlier.len()).filter(|i| *i >= oldest_turn || is_instruction(&earlier[*i])).collect();
    assert_eq!(kept, expected, "whole turns from the newest back, instructions always");
    let reduce_tokens = counter.chat_tokens(ChatPrompt { messages: &reduce, tools, template_kwargs: None }).unwrap();
    assert!(
        reduce_tokens + plan.reduce_max_tokens <= budget.cap,
        "reduce {reduce_tokens} + {}",
        plan.reduce_max_tokens
    );
    assert!(plan.reduce_max_tokens <= budget.max_tokens.unwrap_or(usize::MAX));
    assert_eq!(plan.max_tokens_cut, budget.max_tokens.is_some_and(|max| plan.reduce_max_tokens < max));
}

// -----------------------------------------------------------------------------------------
// Properties over random conversations.

/// One step of a random conversation after the first user message.
#[derive(Debug, Clone)]
enum Step {
    Assistant(usize),
    User(usize),
    ToolCalls(Vec<usize>),
    Instruction(usize),
    Image(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0..300usize).prop_map(Step::Assistant),
        3 => (1..300usize).prop_map(Step::User),
        2 => prop::collection::vec(0..300usize, 1..4).prop_map(Step::ToolCalls),
        1 => (1..40usize).prop_map(Step::Instruction),
        1 => (0..100usize).prop_map(Step::Image),
    ]
}

/// Messages tagged with `_id` (their index in the original), so kept ones are found.
fn conversation(system: Option<usize>, first: usize, steps: &[Step], last: usize) -> Vec<Value> {
    let mut messages = Vec::new();
    let mut add = |mut message: Value| {
        let id = messages.len();
        message["_id"] = json!(id);
        // Distinct words per message, so a piece's tokens identify it.
        messages.push(message);
    };
    if let Some(words) = system {
        add(msg("system", text("sys", words)));
    }
    add(msg("user", text("first", first)));
    for (index, step) in steps.iter().enumerate() {
        let tag = |kind: &str| format!("{kind}{index}_");
        match step {
            Step::Assistant(n) => add(msg("assistant", text(&tag("a"), *n))),
            Step::User(n) => add(msg("user", text(&tag("u"), *n))),
            Step::Instruction(n) => add(msg("developer", text(&tag("d"), *n))),
            Step::Image(n) => add(json!({"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "data:,"}},
                {"type": "text", "text": text(&tag("i"), *n)}
            ]})),
            Step::ToolCalls(answers) => {
                let calls: Vec<Value> = (0..answers.len())
                    .map(|c| {
                        json!({"id": format!("call{index}_{c}"), "type": "function",
                        "function": {"name": "look", "arguments": "{\"q\": 1}"}})
                    })
                    .collect();
                add(json!({"role": "assistant", "content": null, "tool_calls": calls}));
                for (c, n) in answers.iter().enumerate() {
                    add(
                        json!({"role": "tool", "tool_call_id": format!("call{index}_{c}"), "content": text(&tag("t"), *n)}),
                    );
                }
            }
        }
    }
    if last > 0 {
        add(msg("user", text("last", last)));
    }
    messages
}

fn id(message: &Value) -> usize {
    message["_id"].as_u64().unwrap() as usize
}

fn check_middle_out(original: &[Value], kept: &[Value]) {
    let ids: Vec<usize> = kept.iter().map(id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "order kept: {ids:?}");
    let first_user = original.iter().position(|m| role(m) == "user");
    for (index, message) in original.iter().enumerate() {
        let kept_copy = kept.iter().find(|k| id(k) == index);
        if is_instruction(message) {
            assert_eq!(kept_copy, Some(message), "instructions kept whole");
        }
        if Some(index) == first_user || Some(index) == last_user(original) || index + 1 == original.len() {
            assert!(kept_copy.is_some(), "message {index} kept");
        }
        if let Some(copy) = kept_copy {
            let mut without_content = copy.clone();
            without_content["content"] = message["content"].clone();
            assert_eq!(&without_content, message, "only the text changes");
        }
    }
    // Tool groups: a kept call keeps all its answers and a kept answer its call.
    for (index, message) in original.iter().enumerate() {
        if tool_call_text(message).is_some() {
            let answers = original[index + 1..].iter().take_while(|m| role(m) == "tool");
            let present = ids.contains(&index);
            for answer in answers {
                assert_eq!(ids.contains(&id(answer)), present, "tool group {index} split: {ids:?}");
            }
        }
    }
}

/// A random chat request over a random budget.
#[derive(Debug, Clone)]
struct Case {
    system: Option<usize>,
    first: usize,
    steps: Vec<Step>,
    last: usize,
    budget: Budget,
    with_tools: bool,
    action: OnOverflow,
}

fn action() -> impl Strategy<Value = OnOverflow> {
    prop_oneof![Just(OnOverflow::Reject), Just(OnOverflow::MiddleOut), Just(OnOverflow::Chunk)]
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::option::of(0..200usize),
        1..400usize,
        prop::collection::vec(step(), 0..12),
        prop_oneof![Just(0usize), 1..300usize, 300..6000usize],
        (60..4000usize, prop::option::of(prop_oneof![4 => 0..1500usize, 1 => 1500..40000usize]), 1..400usize),
        any::<bool>(),
        action(),
    )
        .prop_map(|(system, first, steps, last, (cap, max_tokens, min_room), with_tools, action)| Case {
            system,
            first,
            steps,
            last,
            budget: Budget { cap, max_tokens, min_room },
            with_tools,
            action,
        })
}

/// Plans `case` and checks the plan's promises; returns the plan's kind.
fn check_case(case: &Case) -> Result<&'static str, TestCaseError> {
    let counter = Words::default();
    let messages = conversation(case.system, case.first, &case.steps, case.last);
    let tools = vec![json!({"type": "function", "function": {"name": "look"}})];
    let tools = case.with_tools.then_some(tools.as_slice());
    let prompt = ChatPrompt { messages: &messages, tools, template_kwargs: None };
    let Case { budget, action, .. } = *case;
    let (cap, max_tokens) = (budget.cap, budget.max_tokens);
    let original = counter.chat_tokens(prompt).unwrap();
    let plan = plan_chat(&counter, prompt, budget, action).unwrap();
    // Under the cap with at least min_room (or the client's smaller max_tokens) left: sent as
    // it is, whatever the action and however large max_tokens is.
    let room = cap.checked_sub(original);
    let fits_as_is = room.is_some_and(|room| room >= budget.needed() || max_tokens.is_some_and(|m| m <= room));
    let max = max_tokens.unwrap_or(usize::MAX);
    Ok(match plan {
        ChatPlan::Fits { prompt_tokens, max_tokens: send } => {
            prop_assert!(fits_as_is);
            prop_assert_eq!(prompt_tokens, original);
            prop_assert!(prompt_tokens + send <= cap && send <= max);
            // The client's max_tokens when it fits, else all the room left.
            prop_assert_eq!(send, max.min(cap - original));
            if send < max { "fits_cut" } else { "fits" }
        }
        ChatPlan::Reject(requested) => {
            prop_assert!(!fits_as_is);
            prop_assert_eq!(requested.prompt, original);
            let completion = (original <= cap).then(|| max_tokens.unwrap_or(budget.needed()));
            prop_assert_eq!(requested.completion, completion);
            "reject"
        }
        ChatPlan::MiddleOut { messages: kept, prompt_tokens, removed_tokens, max_tokens: send } => {
            prop_assert!(!fits_as_is && action != OnOverflow::Reject);
            let counted = counter.chat_tokens(ChatPrompt { messages: &kept, ..prompt }).unwrap();
            prop_assert_eq!(counted, prompt_tokens);
            prop_assert!(prompt_tokens + send <= cap && send >= budget.reserve() && send <= max);
            prop_assert_eq!(send, max.min(cap - prompt_tokens));
            prop_assert_eq!(removed_tokens, original - prompt_tokens);
            check_middle_out(&messages, &kept);
            if kept.iter().any(|m| m["content"].to_string().contains('…')) { "middle_out_cut" } else { "middle_out" }
        }
        ChatPlan::Chunk(plan) => {
            prop_assert!(!fits_as_is && action == OnOverflow::Chunk);
            check_chunk(&counter, &messages, tools, budget, &plan);
            prop_assert!(plan.reduce_max_tokens >= budget.reserve() && plan.reduce_max_tokens <= max);
            if plan.reduce_context.iter().any(|m| !is_instruction(m)) { "chunk_with_earlier_turns" } else { "chunk" }
        }
    })
}

#[test]
fn random_cases_reach_every_kind_of_plan() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let mut kinds: HashMap<&str, usize> = HashMap::new();
    for _ in 0..400 {
        let case = case().new_tree(&mut runner).unwrap().current();
        *kinds.entry(check_case(&case).unwrap()).or_default() += 1;
    }
    println!("plans over 400 random cases: {kinds:?}");
    for kind in ["fits", "fits_cut", "reject", "middle_out", "middle_out_cut", "chunk", "chunk_with_earlier_turns"] {
        assert!(kinds.get(kind).copied().unwrap_or(0) >= 10, "{kind} is rare: {kinds:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn every_plan_keeps_its_promises(case in case()) {
        check_case(&case)?;
    }

    #[test]
    fn text_plans_fit_and_embedding_pieces_rebuild_the_input(
        words in 0..3000usize,
        cap in 40..2000usize,
        max_tokens in prop::option::of(0..500usize),
        min_room in 1..300usize,
        action in prop_oneof![Just(OnOverflow::Reject), Just(OnOverflow::MiddleOut), Just(OnOverflow::Chunk)],
    ) {
        let counter = Words::default();
        let input = text("w", words);
        let budget = Budget { cap, max_tokens, min_room };
        match plan_text(&counter, &input, budget, action) {
            TextPlan::Fits { prompt_tokens, max_tokens: send } | TextPlan::MiddleOut { prompt_tokens, max_tokens: send, .. } => {
                prop_assert!(prompt_tokens + send <= cap);
                prop_assert!(send <= max_tokens.unwrap_or(usize::MAX));
            }
            TextPlan::Reject(requested) => {
                prop_assert_eq!(requested, budget.requested(words + BOS));
                prop_assert!(budget.fitting(words + BOS).is_none());
                let room_to_keep = cap.saturating_sub(budget.reserve() + BOS + 1);
                prop_assert!(action == OnOverflow::Reject || room_to_keep < MIN_KEPT_TOKENS.min(words));
            }
        }
        let pieces = split_for_embedding(&counter, &input, cap);
        prop_assert!(pieces.iter().all(|(piece, _)| counter.text_tokens(piece) <= cap));
        prop_assert_eq!(pieces.iter().map(|(p, _)| p.as_str()).collect::<String>(), input);
        prop_assert_eq!(pieces.iter().map(|(_, n)| n).sum::<usize>(), words);
    }
}
