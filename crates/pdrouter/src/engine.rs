//! What the router knows of the engines behind gRPC workers, below every module that talks
//! to them: which protocol a worker's engine speaks ([`Runtime`]) and what its messages
//! bound, and the bootstrap rendezvous ([`KvTicket`]) where a PD pair's KV hand-over, or in
//! EPD an image item's embedding, meets.
//!
//! `grpc` (channels, calls, translation) and `images` (each item's Encode ticket) both use
//! these; `grpc::runtime` re-exports them.
//!
//! Invariant: a fresh ticket's room is below its runtime's [`Runtime::max_room`] (2^31 for
//! SGLang's `int32`, 2^63 for TokenSpeed's `int64`).

// The runtime names are configuration (`--runtime`); what each runtime's messages can carry
// is this module's, added below (an inherent impl, so callers need no extra import).
pub use crate::config::Runtime;

impl Runtime {
    /// Largest KV bootstrap room the runtime's message holds.
    pub fn max_room(self) -> u64 {
        match self {
            Runtime::Sglang => i32::MAX as u64,
            // vLLM's connectors rendezvous by their own ids, not a room; a ticket for one is
            // never sent.
            Runtime::TokenSpeed | Runtime::Vllm => i64::MAX as u64,
        }
    }

    /// Whether the engine's answers carry prompt logprobs (TokenSpeed's have no field for
    /// them).
    pub fn serves_prompt_logprobs(self) -> bool {
        self != Runtime::TokenSpeed
    }

    /// The order detection asks: the hint first, then the others.
    pub fn detection_order(hint: Option<Runtime>) -> Vec<Runtime> {
        let mut order: Vec<Runtime> = hint.into_iter().collect();
        order.extend(Self::ALL.into_iter().filter(|r| Some(*r) != hint));
        order
    }
}

/// A bootstrap rendezvous: the KV hand-over ticket of one PD sub-request (the Prefill
/// worker's, identical on both legs), or in EPD where one image item's embedding waits (the
/// Encode worker's, [`crate::images::EncodeTicket`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvTicket {
    /// The bootstrapping worker's host.
    pub host: String,
    /// Its bootstrap port (0 on the wire when it has none).
    pub port: Option<u16>,
    /// The rendezvous id, below the runtime's [`Runtime::max_room`].
    pub room: u64,
}

impl KvTicket {
    /// A ticket for the Prefill worker at `host`/`port` with a fresh random room for
    /// `runtime`.
    pub fn fresh(host: &str, port: Option<u16>, runtime: Runtime) -> Self {
        KvTicket {
            host: host.to_owned(),
            port,
            room: rand::random_range(0..=runtime.max_room()),
        }
    }

    /// The bootstrap port as the engines carry it (0: none).
    pub fn wire_port(&self) -> i32 {
        self.port.map_or(0, i32::from)
    }

    /// The room as TokenSpeed's `int64` (its rooms are below 2^63).
    pub fn wire_room(&self) -> i64 {
        i64::try_from(self.room).unwrap_or(i64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rooms_fit_their_runtime() {
        for _ in 0..64 {
            let s = KvTicket::fresh("h", None, Runtime::Sglang).room;
            assert!(i32::try_from(s).is_ok());
        }
        // 64 draws below 2^31 from [0, 2^63) happen with probability 2^-2048.
        let wide = (0..64)
            .any(|_| KvTicket::fresh("h", None, Runtime::TokenSpeed).room > u64::from(u32::MAX));
        assert!(wide);
    }

    #[test]
    fn detection_asks_the_hint_first() {
        assert_eq!(
            Runtime::detection_order(Some(Runtime::TokenSpeed)),
            vec![Runtime::TokenSpeed, Runtime::Sglang, Runtime::Vllm]
        );
        assert_eq!(Runtime::detection_order(None), Runtime::ALL.to_vec());
        assert_eq!(Runtime::parse("tokenspeed"), Some(Runtime::TokenSpeed));
        assert_eq!(Runtime::parse("vllm"), Some(Runtime::Vllm));
        assert_eq!(Runtime::parse("vLLM"), None);
    }
}
