//! The floor rules of docs/architecture.md, held by the compiler's input rather
//! than by a drawing: which room of `src/` may name which. A room is a top-level
//! module of the library (`src/inference/…` is `inference`, `src/hooks.rs` is
//! `hooks`); a room names another when its code says `crate::<room>`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Every room and the rooms it names.
fn rooms() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some("rs") {
                continue;
            }
            let rel = path.strip_prefix(&src).unwrap();
            let first = rel.components().next().unwrap().as_os_str();
            let room = first.to_str().unwrap().trim_end_matches(".rs").to_string();
            if room == "lib" || room == "main" || room == "bin" {
                continue;
            }
            let named = out.entry(room.clone()).or_default();
            for line in std::fs::read_to_string(&path).unwrap().lines() {
                let code = line.split("//").next().unwrap_or("");
                for part in code.split("crate::").skip(1) {
                    let name: String = part
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if !name.is_empty() && name != room {
                        named.insert(name);
                    }
                }
            }
        }
    }
    out
}

fn who_names(rooms: &BTreeMap<String, BTreeSet<String>>, target: &str) -> Vec<String> {
    rooms
        .iter()
        .filter(|(_, named)| named.contains(target))
        .map(|(room, _)| room.clone())
        .collect()
}

const FEATURES: [&str; 3] = ["idempotency", "responses", "search"];
const OWN_DOORS: [&str; 2] = ["batches", "telemetry"];
const LISTENERS: [&str; 4] = ["proxy", "api", "web", "ops"];

#[test]
fn the_rooms_are_the_ones_the_map_names() {
    let rooms = rooms();
    for room in ["inference", "hooks", "proxy", "state", "billing"]
        .iter()
        .chain(&FEATURES)
    {
        assert!(rooms.contains_key(*room), "no room {room}: {rooms:?}");
    }
}

#[test]
fn only_the_wiring_names_the_wiring_and_the_listeners() {
    let rooms = rooms();
    assert_eq!(who_names(&rooms, "server"), Vec::<String>::new());
    for l in LISTENERS {
        let named_by: Vec<String> = who_names(&rooms, l)
            .into_iter()
            .filter(|r| r != "server" && !LISTENERS.contains(&r.as_str()))
            .collect();
        assert_eq!(named_by, Vec::<String>::new(), "{l} is named below it");
    }
}

#[test]
fn only_the_gateway_listener_and_the_wiring_name_the_flow() {
    let rooms = rooms();
    let named_by = who_names(&rooms, "inference");
    assert!(
        named_by.iter().all(|r| r == "proxy" || r == "server"),
        "inference is named by {named_by:?}"
    );
}

#[test]
fn the_flow_and_its_seam_name_no_feature() {
    let rooms = rooms();
    for room in ["inference", "hooks"] {
        let named = &rooms[room];
        for f in FEATURES.iter().chain(&OWN_DOORS) {
            assert!(!named.contains(*f), "{room} names the feature {f}");
        }
    }
}

#[test]
fn a_feature_names_no_other_feature_nor_anything_above_it() {
    let rooms = rooms();
    for f in FEATURES.iter().chain(&OWN_DOORS) {
        let named = &rooms[*f];
        for other in FEATURES.iter().chain(&OWN_DOORS).chain(&LISTENERS) {
            assert!(*other == *f || !named.contains(*other), "{f} names {other}");
        }
        assert!(!named.contains("inference"), "{f} names inference");
    }
}

#[test]
fn the_domain_and_the_ground_name_nothing_above_them() {
    let rooms = rooms();
    let above = [
        "server",
        "proxy",
        "api",
        "web",
        "ops",
        "batches",
        "telemetry",
        "inference",
        "hooks",
        "idempotency",
        "responses",
        "search",
        "upstream",
        "downstream",
        "state",
    ];
    for room in [
        "accounts", "billing", "byok", "catalog", "store", "config", "error", "metrics", "money",
        "time", "deadline", "priority",
    ] {
        let named = &rooms[room];
        for a in above {
            assert!(!named.contains(a), "{room} names {a}, a room above it");
        }
    }
}
