//! Upstream wire protocols: rendering requests for a rung and reading its answers.

pub mod openai_chat;
