//! The chat inbound format (see the module contract in `inbound`).
