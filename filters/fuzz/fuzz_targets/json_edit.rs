//! The byte-level rewrites of provider answers agree with a serde-based rewrite on
//! arbitrary bytes: where serde reads an object, the edited bytes parse and equal
//! serde's reading with the member set; elsewhere nothing panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use sluice_filters::json::edit::{set_member, set_nested};

fuzz_target!(|data: &[u8]| {
    let out = set_member(data, "provider", br#""openai:m""#);
    let nested = set_nested(data, &["usage"], "cost", b"0.25");
    let Ok(Value::Object(mut want)) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let got: Value = serde_json::from_slice(&out).expect("an edited object parses");
    let mut top = want.clone();
    top.insert("provider".into(), Value::from("openai:m"));
    assert_eq!(got, Value::Object(top));
    match want.get_mut("usage").and_then(Value::as_object_mut) {
        Some(u) => {
            u.insert("cost".into(), Value::from(0.25));
            let got: Value = serde_json::from_slice(&nested.expect("usage is an object"))
                .expect("an edited object parses");
            assert_eq!(got, Value::Object(want));
        }
        None => assert!(nested.is_none()),
    }
});
