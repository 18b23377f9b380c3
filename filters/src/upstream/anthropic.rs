//! The anthropic upstream wire (see the module contract in `upstream`).
