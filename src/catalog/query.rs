//! The catalog list query of `GET /api/models`: filters, sort, pagination, each bad
//! value a 400 `invalid_parameter` naming the query field.

use super::{Model, ModelKind, Retention};
use sluice_filters::ApiError;
use std::collections::HashMap;
use std::sync::Arc;

pub const DEFAULT_LIMIT: usize = 100;
pub const MAX_LIMIT: usize = 1000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SortKey {
    Slug,
    Context,
    InputPrice,
    OutputPrice,
    Created,
}

#[derive(Debug, Default)]
pub struct ListQuery {
    modality: Option<String>,
    category: Option<String>,
    provider: Option<String>,
    kind: Option<ModelKind>,
    min_context: Option<u64>,
    retention: Option<Retention>,
    max_input_price: Option<u64>,
    max_output_price: Option<u64>,
    sort: Option<(SortKey, bool)>,
    pub limit: usize,
    pub offset: usize,
}

fn number<T: std::str::FromStr>(name: &'static str, v: &str) -> Result<T, ApiError> {
    v.parse().map_err(|_| {
        ApiError::invalid_parameter(name, format!("{name} must be a non-negative integer"))
    })
}

impl ListQuery {
    pub fn parse(q: &HashMap<String, String>) -> Result<ListQuery, ApiError> {
        let mut out = ListQuery {
            limit: DEFAULT_LIMIT,
            ..ListQuery::default()
        };
        for (k, v) in q {
            match k.as_str() {
                "modality" => out.modality = Some(v.clone()),
                "category" => out.category = Some(v.clone()),
                "provider" => out.provider = Some(v.clone()),
                "kind" => {
                    out.kind = Some(match v.as_str() {
                        "chat" => ModelKind::Chat,
                        "embedding" => ModelKind::Embedding,
                        _ => {
                            return Err(ApiError::invalid_parameter(
                                "kind",
                                "kind must be chat or embedding",
                            ))
                        }
                    })
                }
                "min_context" => out.min_context = Some(number("min_context", v)?),
                "max_input_price" => out.max_input_price = Some(number("max_input_price", v)?),
                "max_output_price" => out.max_output_price = Some(number("max_output_price", v)?),
                "retention" => {
                    out.retention = Some(Retention::parse(v).ok_or_else(|| {
                        ApiError::invalid_parameter(
                            "retention",
                            "retention must be zdr_all_rungs, zdr_enforceable or not_zdr",
                        )
                    })?)
                }
                "sort" => {
                    let (name, desc) = match v.strip_prefix('-') {
                        Some(n) => (n, true),
                        None => (v.as_str(), false),
                    };
                    let key = match name {
                        "slug" => SortKey::Slug,
                        "context_window" | "context" => SortKey::Context,
                        "input_price" | "price" => SortKey::InputPrice,
                        "output_price" => SortKey::OutputPrice,
                        "created" => SortKey::Created,
                        _ => {
                            return Err(ApiError::invalid_parameter(
                                "sort",
                                "sort must be one of slug, context_window, input_price, output_price, created (prefix - for descending)",
                            ))
                        }
                    };
                    out.sort = Some((key, desc));
                }
                "limit" => {
                    out.limit = number("limit", v)?;
                    if out.limit == 0 || out.limit > MAX_LIMIT {
                        return Err(ApiError::invalid_parameter(
                            "limit",
                            format!("limit must be between 1 and {MAX_LIMIT}"),
                        ));
                    }
                }
                "offset" => out.offset = number("offset", v)?,
                _ => {
                    return Err(ApiError::new(
                        sluice_filters::ErrorCode::InvalidParameter,
                        format!("unknown query parameter {k:?}"),
                    )
                    .param(k.clone()))
                }
            }
        }
        Ok(out)
    }

    fn matches(&self, m: &Model, verdict: &dyn Fn(&Model) -> Option<Retention>) -> bool {
        let s = &m.spec;
        self.modality
            .as_ref()
            .is_none_or(|x| s.modalities.iter().any(|y| y == x))
            && self.category.as_ref().is_none_or(|x| &s.category == x)
            && self
                .provider
                .as_ref()
                .is_none_or(|x| s.rungs.iter().any(|r| &r.provider == x))
            && self.kind.is_none_or(|k| s.kind == k)
            && self.min_context.is_none_or(|n| s.context_window >= n)
            && self.max_input_price.is_none_or(|n| s.price.input <= n)
            && self.max_output_price.is_none_or(|n| s.price.output <= n)
            && self
                .retention
                .is_none_or(|bar| verdict(m).is_some_and(|r| r.meets(bar)))
    }

    /// The page of matching models and the total count of matches; `verdict` is
    /// each model's retention as the caller's active route has it.
    pub fn apply<'a>(
        &self,
        models: Vec<&'a Arc<Model>>,
        verdict: &dyn Fn(&Model) -> Option<Retention>,
    ) -> (Vec<&'a Arc<Model>>, usize) {
        let mut hits: Vec<&Arc<Model>> = models
            .into_iter()
            .filter(|m| self.matches(m, verdict))
            .collect();
        if let Some((key, desc)) = self.sort {
            hits.sort_by(|a, b| {
                let o = match key {
                    SortKey::Slug => std::cmp::Ordering::Equal,
                    SortKey::Context => a.spec.context_window.cmp(&b.spec.context_window),
                    SortKey::InputPrice => a.spec.price.input.cmp(&b.spec.price.input),
                    SortKey::OutputPrice => a.spec.price.output.cmp(&b.spec.price.output),
                    SortKey::Created => a.created.cmp(&b.created),
                }
                .then_with(|| a.spec.slug.cmp(&b.spec.slug));
                if desc {
                    o.reverse()
                } else {
                    o
                }
            });
        }
        let total = hits.len();
        let page = hits
            .into_iter()
            .skip(self.offset)
            .take(self.limit)
            .collect();
        (page, total)
    }
}
