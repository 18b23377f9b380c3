//! The openai_responses upstream wire (see the module contract in `upstream`).
