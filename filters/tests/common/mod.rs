//! Golden-file plumbing shared by the filters test files: `golden!("area")` defines
//! `golden_path`, `read`, `updating`, `check_json` (JSON compared as values, so
//! member order is irrelevant; files written pretty) and `check_text` (compared
//! exactly: SSE order and framing matter) over `tests/golden/<area>/`.
//!
//! Set `UPDATE_GOLDEN=1` to rewrite the expected files from the code under test;
//! review every rewritten file by hand against the provider's reference.

macro_rules! golden {
    ($area:expr) => {
        fn golden_path(name: &str) -> std::path::PathBuf {
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("tests/golden")
                .join($area)
                .join(name)
        }

        #[allow(dead_code)]
        fn read(name: &str) -> Vec<u8> {
            std::fs::read(golden_path(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
        }

        fn updating() -> bool {
            std::env::var_os("UPDATE_GOLDEN").is_some()
        }

        #[allow(dead_code)]
        fn check_json(name: &str, actual: &serde_json::Value) {
            if updating() {
                let mut text = serde_json::to_string_pretty(actual).unwrap();
                text.push('\n');
                std::fs::write(golden_path(name), text).unwrap();
                return;
            }
            let expected: serde_json::Value = serde_json::from_slice(&read(name)).unwrap();
            assert_eq!(
                actual,
                &expected,
                "{name} differs; actual:\n{}",
                serde_json::to_string_pretty(actual).unwrap()
            );
        }

        #[allow(dead_code)]
        fn check_text(name: &str, actual: &str) {
            if updating() {
                std::fs::write(golden_path(name), actual).unwrap();
                return;
            }
            let expected = String::from_utf8(read(name)).unwrap();
            assert_eq!(actual, expected, "{name} differs; actual:\n{actual}");
        }
    };
}
