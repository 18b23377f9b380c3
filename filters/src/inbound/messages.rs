//! The messages inbound format (see the module contract in `inbound`).
