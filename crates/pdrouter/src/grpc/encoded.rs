//! A long prompt's `Generate` request encoded once for both legs of a PD pair.
//!
//! In PD the Prefill and the Decode worker get the same message (same request id, same KV
//! ticket, same prompt). For a 32k-token prompt, encoding it costs about as much as writing
//! it to the socket, so encoding it once per leg doubles the CPU a long prompt takes on the
//! router. When the two legs' calls would produce identical messages, they share a
//! [`SharedEncoding`]: the first leg whose request body is written encodes the message into
//! it, and the other copies those bytes instead of encoding again. Encoding still happens
//! where the bulk lane writes request bodies (off the async workers, see [`super::bulk`]).
//!
//! Invariants:
//! - Two calls share an encoding only if every field their messages are built from is
//!   equal ([`super::runtime::Call::share_encoding`] checks) and they are sent to workers of
//!   the same runtime (checked when encoding); otherwise each encodes its own message.
//! - Bytes on the wire are exactly the message's protobuf encoding, as the generated client
//!   would write them; only who encodes changes.

use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};

use bytes::{BufMut as _, Bytes};
use tonic::codec::{Codec, EncodeBuf, Encoder};
use tonic::transport::Channel;
use tonic::{Response, Status, Streaming};

use crate::engine::Runtime;

/// The encoded message the legs of one prompt share, filled by the first to be written, with
/// the runtime whose message it is.
#[derive(Debug, Clone, Default)]
pub struct SharedEncoding(Arc<OnceLock<(Runtime, Bytes)>>);

impl SharedEncoding {
    /// The encoding of `msg`, `runtime`'s message: the one a sibling made, if it made it for
    /// the same runtime (a worker's runtime is re-learned if its service goes away, so the
    /// legs could in principle disagree), else made now.
    fn get_or_encode<M: prost::Message>(&self, runtime: Runtime, msg: &M) -> Bytes {
        let encode = || Bytes::from(msg.encode_to_vec());
        let (made_for, bytes) = self.0.get_or_init(|| (runtime, encode()));
        if *made_for == runtime {
            bytes.clone()
        } else {
            encode()
        }
    }

    /// Whether some leg has encoded its message already.
    #[cfg(test)]
    pub(crate) fn is_encoded(&self) -> bool {
        self.0.get().is_some()
    }
}

/// A message to send, with the encoding it shares with its sibling leg.
#[derive(Debug)]
pub struct Prepared<M> {
    msg: M,
    runtime: Runtime,
    encoding: SharedEncoding,
}

impl<M> Prepared<M> {
    /// The runtime whose protocol the message is.
    pub fn runtime(&self) -> Runtime {
        self.runtime
    }

    /// `msg`, a message of `runtime`'s protocol, to be written with `encoding`.
    pub fn new(msg: M, runtime: Runtime, encoding: SharedEncoding) -> Self {
        Self {
            msg,
            runtime,
            encoding,
        }
    }
}

/// Writes a [`Prepared`] message and reads prost-decoded `R` answers.
struct PreparedCodec<M, R>(PhantomData<fn(M) -> R>);

impl<M, R> Codec for PreparedCodec<M, R>
where
    M: prost::Message + Send + 'static,
    R: prost::Message + Default + Send + 'static,
{
    type Encode = Prepared<M>;
    type Decode = R;
    type Encoder = PreparedEncoder<M>;
    type Decoder = tonic_prost::ProstDecoder<R>;

    fn encoder(&mut self) -> Self::Encoder {
        PreparedEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::default()
    }
}

struct PreparedEncoder<M>(PhantomData<fn(M)>);

impl<M: prost::Message> Encoder for PreparedEncoder<M> {
    type Item = Prepared<M>;
    type Error = Status;

    fn encode(&mut self, item: Prepared<M>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item.encoding.get_or_encode(item.runtime, &item.msg));
        Ok(())
    }
}

/// Starts the server-streaming `method` of `service` on `channel` with a prepared request;
/// the same call the generated clients make (path `/{service}/{method}`), answers decoded the
/// same way.
pub async fn server_streaming<M, R>(
    channel: Channel,
    service: &'static str,
    method: &'static str,
    request: tonic::Request<Prepared<M>>,
    max_decoding: usize,
) -> Result<Response<Streaming<R>>, Status>
where
    M: prost::Message + Send + Sync + 'static,
    R: prost::Message + Default + Send + 'static,
{
    let path = http::uri::PathAndQuery::try_from(format!("/{service}/{method}"))
        .map_err(|e| Status::internal(format!("bad method path: {e}")))?;
    let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(max_decoding);
    grpc.ready()
        .await
        .map_err(|e| Status::unknown(format!("Service was not ready: {e}")))?;
    let mut request = request;
    request
        .extensions_mut()
        .insert(tonic::GrpcMethod::new(service, method));
    let codec = PreparedCodec::<M, R>(PhantomData);
    grpc.server_streaming(request, path, codec).await
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
    }
}
