//! Tool search served by the gateway, around the waterfall: the model is called;
//! while its answer is a call of `tool_search` (and rounds are left), the search
//! round runs (`search::round`: the tools it finds are loaded, the round joins the
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
pub async fn serve(
    engine: &Engine,
    session: &mut Session,
    tally: &mut Tally,
    model: &Model,
    mut parsed: ParsedRequest<'_>,
) -> Outcome {
    if !parsed.prep.rounds() {
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
        if let (Some(enc), Some(o)) = (turn.encoder, tally.orch.as_mut()) {
            o.keep_stream(enc);
        }
        crate::search::round(&mut parsed.prep, &mut parsed.req, turn.response);
    }
}
