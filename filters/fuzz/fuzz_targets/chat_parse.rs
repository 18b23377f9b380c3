//! The chat inbound parser never panics, and whatever it accepts renders to a
//! request every upstream wire can take without panicking either.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_filters::inbound::chat;
use sluice_filters::upstream::{anthropic, bedrock, gemini, openai_chat, openai_responses};

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = chat::parse(data) {
        let _ = openai_chat::render(&req, "m", req.stream);
        let _ = openai_responses::render(&req, "m", req.stream);
        let _ = anthropic::render(&req, "m", req.stream);
        let _ = gemini::render(&req, "m", req.stream);
        let _ = bedrock::render(&req, "m", req.stream);
    }
});
