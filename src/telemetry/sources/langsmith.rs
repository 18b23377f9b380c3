//! `langsmith`: LangSmith runs, as its export and its API (`POST
//! /api/v1/runs/query` → `{runs, cursors: {next}}`) give them: `id`, `trace_id`,
//! `parent_run_id`, `name`, `run_type` (llm, chain, tool, retriever, ...),
//! `start_time`, `end_time`, `inputs`, `outputs` (LangChain's serialized messages
//! and generations, or plain chat), `extra.invocation_params.model` /
//! `extra.metadata.ls_model_name` and `ls_provider`, `prompt_tokens`,
//! `completion_tokens`, `total_cost`, `tags`, `error`.

use super::common::{float, int, messages, records, tags, text, time_ms};
use crate::telemetry::model::{Span, Trace, TraceSet};

pub fn parse(bytes: &[u8]) -> Result<Vec<Trace>, String> {
    let recs = records(bytes, &["runs"])?;
    let mut set = TraceSet::default();
    let mut n = 0;
    for r in &recs {
        let Some(id) = text(r.get("id")) else {
            continue;
        };
        if r.get("run_type").is_none() {
            continue;
        }
        n += 1;
        let trace_id = text(r.get("trace_id")).unwrap_or_else(|| id.clone());
        let extra = r.get("extra");
        let params = extra.and_then(|e| e.get("invocation_params"));
        let meta = extra.and_then(|e| e.get("metadata"));
        let kind = text(r.get("run_type")).unwrap_or_else(|| "chain".into());
        let span = Span {
            span_id: id.clone(),
            parent_id: text(r.get("parent_run_id")),
            name: text(r.get("name")).unwrap_or_else(|| kind.clone()),
            kind,
            started_at: time_ms(r.get("start_time")),
            ended_at: time_ms(r.get("end_time")),
            model: meta.and_then(|m| text(m.get("ls_model_name"))).or_else(|| {
                params.and_then(|p| text(p.get("model")).or_else(|| text(p.get("model_name"))))
            }),
            provider: meta.and_then(|m| text(m.get("ls_provider"))),
            input: r
                .get("inputs")
                .map(|v| messages(v, "user"))
                .unwrap_or_default(),
            output: r
                .get("outputs")
                .map(|v| messages(v, "assistant"))
                .unwrap_or_default(),
            input_tokens: int(r.get("prompt_tokens")).unwrap_or(0),
            output_tokens: int(r.get("completion_tokens")).unwrap_or(0),
            cost_usd: float(r.get("total_cost")),
            tags: tags(r.get("tags")),
            error: text(r.get("error")),
        };
        let is_root = span.parent_id.is_none();
        let t = set.trace(&trace_id);
        if is_root {
            t.name = Some(span.name.clone());
            t.tags.extend(span.tags.iter().cloned());
        }
        // LLM runs' token counts also roll up into their parents' totals in
        // LangSmith; only leaf-level counts are kept here, so the trace sums once.
        t.spans.push(span);
    }
    if n == 0 {
        return Err("no LangSmith runs (records with id and run_type)".into());
    }
    let mut traces = set.finish();
    for t in &mut traces {
        let parents: std::collections::HashSet<String> =
            t.spans.iter().filter_map(|s| s.parent_id.clone()).collect();
        for s in &mut t.spans {
            if s.kind != "llm" && parents.contains(&s.span_id) {
                s.input_tokens = 0;
                s.output_tokens = 0;
                s.cost_usd = None;
            }
        }
    }
    Ok(traces)
}
