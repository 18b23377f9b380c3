//! The responses inbound format (see the module contract in `inbound`).
