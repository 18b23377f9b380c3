//! Rounds around the waterfall (tool search served by the gateway): the model is
//! called; while its answer is a call of `tool_search` (and rounds are left), the
//! loop part runs its round (the tools it finds are loaded, the round joins the
//! conversation) and the model is called again, within the same request. Each
//! call is a full walk of the waterfall (fail-over included), counts as an
//! attempt in the receipt and is billed; the caller sees only the final answer
//! (a stream streams only the final turn, or continues one a round began).

use super::plan::ParsedRequest;
use super::tally::{Outcome, Tally};
use super::waterfall;
use super::Engine;
use crate::catalog::Model;
use pingora::proxy::Session;

/// Serves a parsed request: the waterfall once, or in rounds when the gateway
/// serves its tool search.
pub(crate) async fn serve(
    engine: &Engine,
    session: &mut Session,
    tally: &mut Tally,
    model: &Model,
    mut parsed: ParsedRequest<'_>,
) -> Outcome {
    if !parsed.part.as_ref().is_some_and(|p| p.rounds()) {
        return waterfall::serve(engine, session, tally, model, &parsed).await;
    }
    loop {
        let call = Box::pin(waterfall::serve(engine, session, tally, model, &parsed));
        let turn = match call.await {
            Outcome::Round(turn) => turn,
            done => return done,
        };
        tally.bank_round(&model.spec.price);
        let turn = *turn;
        if let (Some(enc), Some(o)) = (turn.encoder, tally.extra.as_mut()) {
            o.keep_stream(enc);
        }
        if let Some(part) = parsed.part.as_mut() {
            part.round(&mut parsed.req, turn.response);
        }
    }
}
