//! The bedrock upstream wire (see the module contract in `upstream`).
