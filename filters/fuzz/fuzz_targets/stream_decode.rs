//! Upstream stream decoders never panic on arbitrary bytes, split anywhere.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_filters::ir::StreamDecoder;
use sluice_filters::sse::SseDecoder;
use sluice_filters::upstream::{anthropic, bedrock, gemini, openai_chat, openai_responses};

fuzz_target!(|data: &[u8]| {
    let split = data.first().map_or(0, |b| *b as usize) % (data.len().max(1));
    let mut decoders: Vec<Box<dyn StreamDecoder>> = vec![
        Box::new(openai_chat::Decoder::new()),
        Box::new(openai_responses::Decoder::new()),
        Box::new(anthropic::Decoder::new()),
        Box::new(gemini::Decoder::new()),
    ];
    let mut sse = SseDecoder::new();
    sse.push(&data[..split]);
    sse.push(&data[split..]);
    let mut out = Vec::new();
    while let Some(ev) = sse.next_event() {
        for d in decoders.iter_mut() {
            let _ = d.frame(ev.event.as_deref(), ev.data.as_bytes(), &mut out);
        }
    }
    let mut frames = bedrock::FrameDecoder::new();
    frames.push(&data[..split]);
    frames.push(&data[split..]);
    let mut bd = bedrock::Decoder::new();
    while let Some(Ok(f)) = frames.next_frame() {
        let _ = bd.frame(Some(&f.event_type), &f.payload, &mut out);
    }
});
