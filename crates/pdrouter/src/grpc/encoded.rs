//! A `Generate` request encoded once for both legs of a PD pair; a long prompt's, off the
//! async workers.
//!
//! In PD the Prefill and the Decode worker get the same message (same request id, same KV
//! ticket, same prompt): when the two legs' calls would produce identical messages they share
//! a [`SharedEncoding`], and the first to be encoded fills it for the other. A short prompt's
//! message is encoded and framed where its call runs (encoding it is a few thousand
//! instructions, a tenth of what sending it costs); a 32k-token prompt's is a few hundred
//! kilobytes and costs about as much as writing it to the socket, so every call on the bulk
//! lane (see [`super::bulk`]) is encoded on the idle-priority encoding thread
//! ([`crate::cpu_pool::encode`]) before it is sent, and sent as those bytes.
//!
//! Invariants:
//! - Two calls share an encoding only if every field their messages are built from is
//!   equal ([`super::runtime::Call::share_encoding`] checks) and they are sent to workers of
//!   the same runtime in the same form, framed or not (checked when encoding); otherwise each
//!   encodes its own message.
//! - Bytes on the wire are exactly the message's protobuf encoding, as the generated client
//!   would write them; only who encodes, and where, changes.
//! - An encoding whose call is dropped before the encoding thread took it is never made (the
//!   pool drops jobs whose caller left); if the pool refuses (full, late) the message is
//!   encoded where the call runs instead, since the request was already admitted.

use std::sync::{Arc, OnceLock};

use bytes::{BufMut as _, Bytes, BytesMut};
use tonic::Status;

use crate::cpu_pool::{self, PoolError};
use crate::engine::Runtime;

/// `msg` encoded and framed (gRPC's uncompressed message prefix) in one buffer.
pub(super) fn framed<M: prost::Message>(msg: &M) -> Bytes {
    let len = msg.encoded_len();
    let mut buf = BytesMut::with_capacity(5 + len);
    buf.put_u8(0);
    buf.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    // `encode` would measure the message a second time to check the room; the buffer was
    // sized from `len` above (and grows if it had to).
    msg.encode_raw(&mut buf);
    buf.freeze()
}

/// What a shared encoding was made as: the runtime whose message it is, and whether it
/// carries gRPC's message prefix.
type Made = (Runtime, bool);

/// The encoded message the legs of one prompt share, filled by the first to be encoded, with
/// what it was made as.
#[derive(Debug, Clone, Default)]
pub struct SharedEncoding(Arc<OnceLock<(Made, Bytes)>>);

impl SharedEncoding {
    /// The bytes made as `made`: the ones a sibling made, if it made them the same way (a
    /// worker's runtime is re-learned if its service goes away, so the legs could in
    /// principle disagree), else made now by `make`.
    fn get_or_make(&self, made: Made, make: impl FnOnce() -> Bytes) -> Bytes {
        let mut make = Some(make);
        let (made_as, bytes) = self
            .0
            .get_or_init(|| (made, make.take().map(|m| m()).unwrap_or_default()));
        match make {
            Some(m) if *made_as != made => m(),
            _ => bytes.clone(),
        }
    }

    /// `runtime`'s message framed for the wire (prefix included): the sibling's, if the call
    /// has one (`shared`), or built by `msg` and framed now. The message itself is only built
    /// if this leg frames it.
    pub(super) fn framed<M: prost::Message>(
        shared: Option<&Self>,
        runtime: Runtime,
        msg: impl FnOnce() -> M,
    ) -> Bytes {
        let make = || framed(&msg());
        match shared {
            Some(shared) => shared.get_or_make((runtime, true), make),
            None => make(),
        }
    }

    /// The encoding of `msg`, `runtime`'s message, unframed.
    fn get_or_encode<M: prost::Message>(&self, runtime: Runtime, msg: &M) -> Bytes {
        self.get_or_make((runtime, false), || Bytes::from(msg.encode_to_vec()))
    }

    /// The sibling's unframed encoding, if it made one for `runtime`.
    fn made_for(&self, runtime: Runtime) -> Option<Bytes> {
        self.0
            .get()
            .and_then(|(made_as, bytes)| (*made_as == (runtime, false)).then(|| bytes.clone()))
    }

    /// The encoding of `msg`, `runtime`'s message, made on the encoding thread unless the
    /// sibling leg made it already.
    pub async fn encode<M>(self, runtime: Runtime, msg: M) -> Result<Bytes, Status>
    where
        M: prost::Message + Send + Sync + 'static,
    {
        if let Some(bytes) = self.made_for(runtime) {
            return Ok(bytes);
        }
        let msg = Arc::new(msg);
        let (shared, job_msg) = (self.clone(), msg.clone());
        match cpu_pool::encode(move || shared.get_or_encode(runtime, &*job_msg)).await {
            Ok(bytes) => Ok(bytes),
            Err(PoolError::Panicked) => Err(Status::internal("encoding the request panicked")),
            Err(PoolError::Full | PoolError::Late | PoolError::Stopped) => {
                Ok(self.get_or_encode(runtime, &*msg))
            }
        }
    }

    /// Whether some leg has encoded its message already.
    #[cfg(test)]
    pub(crate) fn is_encoded(&self) -> bool {
        self.0.get().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pdrouter_proto::scheduler::{GenerateRequest, TokenizedInput};

    #[test]
    fn the_first_leg_encodes_and_its_sibling_reuses_the_bytes() {
        let msg = GenerateRequest {
            request_id: "r-1".to_owned(),
            tokenized: Some(TokenizedInput {
                original_text: "hello".to_owned(),
                input_ids: (0..5000).collect(),
            }),
            stream: true,
            ..Default::default()
        };
        let shared = SharedEncoding::default();
        let sibling = shared.clone();
        assert!(!sibling.is_encoded());
        let first = shared.get_or_encode(Runtime::Sglang, &msg);
        assert_eq!(first, prost::Message::encode_to_vec(&msg));
        assert!(sibling.is_encoded());
        // The sibling's message is not encoded again: it is equal by construction.
        let second = sibling.get_or_encode(Runtime::Sglang, &GenerateRequest::default());
        assert_eq!(second, first);
        assert_eq!(second.as_ptr(), first.as_ptr());
        // A sibling speaking another runtime encodes its own message.
        let other = GenerateRequest::default();
        let third = sibling.get_or_encode(Runtime::TokenSpeed, &other);
        assert_eq!(third, prost::Message::encode_to_vec(&other));
        // Nor does one that wants the message framed.
        let shared_framed = SharedEncoding::framed(Some(&sibling), Runtime::Sglang, || msg.clone());
        assert_eq!(shared_framed, framed(&msg));
        assert_eq!(&shared_framed[5..], &first[..]);
    }

    #[test]
    fn a_short_prompts_sibling_takes_the_framed_message_without_building_its_own() {
        let msg = GenerateRequest {
            request_id: "r-2".to_owned(),
            tokenized: Some(TokenizedInput {
                original_text: "hi".to_owned(),
                input_ids: vec![1, 2],
            }),
            ..Default::default()
        };
        let shared = SharedEncoding::default();
        let first = SharedEncoding::framed(Some(&shared), Runtime::Sglang, || msg.clone());
        let mut want = vec![0u8];
        want.extend_from_slice(
            &u32::try_from(prost::Message::encoded_len(&msg))
                .unwrap()
                .to_be_bytes(),
        );
        want.extend_from_slice(&prost::Message::encode_to_vec(&msg));
        assert_eq!(first, want);
        let second =
            SharedEncoding::framed(Some(&shared), Runtime::Sglang, || -> GenerateRequest {
                panic!("the sibling built its message")
            });
        assert_eq!(second.as_ptr(), first.as_ptr());
        // A sibling of another runtime builds and frames its own.
        let other =
            SharedEncoding::framed(Some(&shared), Runtime::TokenSpeed, GenerateRequest::default);
        assert_eq!(&other[..], &[0, 0, 0, 0, 0]);
        // The unframed form is never taken for the framed one.
        assert!(shared.made_for(Runtime::Sglang).is_none());
    }

    /// A message that records the thread it was encoded on.
    #[derive(Clone, Debug, Default)]
    struct Probe(Arc<std::sync::Mutex<Option<String>>>);

    impl prost::Message for Probe {
        fn encode_raw(&self, buf: &mut impl bytes::BufMut) {
            *self.0.lock().unwrap() = std::thread::current().name().map(str::to_owned);
            buf.put_slice(&[0x0a, 0x01, b'x']);
        }
        fn merge_field(
            &mut self,
            tag: u32,
            wire_type: prost::encoding::WireType,
            buf: &mut impl bytes::Buf,
            ctx: prost::encoding::DecodeContext,
        ) -> Result<(), prost::DecodeError> {
            prost::encoding::skip_field(wire_type, tag, buf, ctx)
        }
        fn encoded_len(&self) -> usize {
            3
        }
        fn clear(&mut self) {}
    }

    /// A bulk call's message is encoded on the encoding thread, not where the call runs, and
    /// its sibling gets the same bytes without encoding again.
    #[tokio::test]
    async fn the_message_is_encoded_on_the_encoding_thread_once_for_both_legs() {
        let probe = Probe::default();
        let shared = SharedEncoding::default();
        let bytes = shared
            .clone()
            .encode(Runtime::Sglang, probe.clone())
            .await
            .unwrap();
        assert_eq!(&bytes[..], &[0x0a, 0x01, b'x']);
        assert_eq!(
            probe.0.lock().unwrap().as_deref(),
            Some("pdrouter-encode-0")
        );
        let sibling = Probe::default();
        let again = shared
            .encode(Runtime::Sglang, sibling.clone())
            .await
            .unwrap();
        assert_eq!(again.as_ptr(), bytes.as_ptr());
        assert!(
            sibling.0.lock().unwrap().is_none(),
            "the sibling encoded again"
        );
    }
}
