//! The gemini upstream wire (see the module contract in `upstream`).
