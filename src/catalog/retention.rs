//! The data-retention verdict of a model, folded over the platform rungs its active
//! route serves.

use super::model::RungSpec;
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Retention {
    /// Every platform rung served is zero-retention.
    ZdrAllRungs,
    /// Some but not all are.
    ZdrEnforceable,
    /// None is.
    NotZdr,
}

impl Retention {
    pub fn as_str(self) -> &'static str {
        match self {
            Retention::ZdrAllRungs => "zdr_all_rungs",
            Retention::ZdrEnforceable => "zdr_enforceable",
            Retention::NotZdr => "not_zdr",
        }
    }

    pub fn parse(s: &str) -> Option<Retention> {
        match s {
            "zdr_all_rungs" => Some(Retention::ZdrAllRungs),
            "zdr_enforceable" => Some(Retention::ZdrEnforceable),
            "not_zdr" => Some(Retention::NotZdr),
            _ => None,
        }
    }

    /// Whether a model with this verdict meets the bar `filter` asks for:
    /// `zdr_enforceable` includes `zdr_all_rungs`; `not_zdr` lists exactly those.
    pub fn meets(self, filter: Retention) -> bool {
        match filter {
            Retention::ZdrAllRungs => self == Retention::ZdrAllRungs,
            Retention::ZdrEnforceable => self != Retention::NotZdr,
            Retention::NotZdr => self == Retention::NotZdr,
        }
    }
}

/// The verdict over platform rungs; `None` when there are none (an org's own model).
pub fn verdict<'a>(platform_rungs: impl IntoIterator<Item = &'a RungSpec>) -> Option<Retention> {
    let (mut total, mut zdr) = (0usize, 0usize);
    for r in platform_rungs {
        total += 1;
        zdr += r.zdr as usize;
    }
    match (total, zdr) {
        (0, _) => None,
        (t, z) if t == z => Some(Retention::ZdrAllRungs),
        (_, 0) => Some(Retention::NotZdr),
        _ => Some(Retention::ZdrEnforceable),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rung(zdr: bool) -> RungSpec {
        RungSpec {
            provider: "openai".into(),
            provider_model_id: "m".into(),
            base_url: String::new(),
            zdr,
            caps: vec![],
        }
    }

    #[test]
    fn folds_as_the_spec_table_says() {
        assert_eq!(
            verdict(&[rung(true), rung(true)]),
            Some(Retention::ZdrAllRungs)
        );
        assert_eq!(
            verdict(&[rung(true), rung(false)]),
            Some(Retention::ZdrEnforceable)
        );
        assert_eq!(verdict(&[rung(false)]), Some(Retention::NotZdr));
        assert_eq!(verdict(&[]), None);
    }

    #[test]
    fn enforceable_filter_includes_all_rungs() {
        assert!(Retention::ZdrAllRungs.meets(Retention::ZdrEnforceable));
        assert!(Retention::ZdrEnforceable.meets(Retention::ZdrEnforceable));
        assert!(!Retention::NotZdr.meets(Retention::ZdrEnforceable));
        assert!(!Retention::ZdrEnforceable.meets(Retention::ZdrAllRungs));
    }
}
