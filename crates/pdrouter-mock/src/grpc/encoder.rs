//! The encode role: TokenSpeed's `TokenSpeedEncoder` service over the shared engine model.
//!
//! `Encode` carries one multimodal item and its room per call. The mock checks the item (an
//! encoder input with a shape and a dtype, exactly one room, not negative), waits like any
//! worker (hang switch, injected failure, delay), counts the item and finishes its room, which
//! is what a Prefill worker waiting for the item's embedding polls (`GET /room/{room}` on this
//! worker's port). `/mock/stats` shows the request: item hashes, rooms and tensor shapes. The
//! standard health service (`grpc.health.v1.Health/Check`) follows the `healthy` control.

use std::sync::Arc;

use pdrouter_proto::grpc::health::v1 as health;
use pdrouter_proto::tokenspeed_encoder::token_speed_encoder_server::TokenSpeedEncoder;
use pdrouter_proto::tokenspeed_encoder::{EncodeRequest, EncodeResponse};
use pdrouter_proto::tokenspeed_scheduler::tensor_data::Payload;
use serde_json::{Value, json};
use tonic::{Request, Response, Status};

use crate::state::{InflightGuard, Shared};

/// The encode service of one mock worker.
#[derive(Debug)]
pub(crate) struct Encoder {
    pub(crate) shared: Arc<Shared>,
}

/// The rooms of `req`'s items, one per item, checked.
fn rooms(req: &EncodeRequest) -> Result<Vec<u64>, Status> {
    let items = req.mm_inputs.as_ref().map_or(&[][..], |m| &m.items[..]);
    if items.is_empty() {
        return Err(Status::invalid_argument("mm_inputs has no items"));
    }
    if items.len() != req.items.len() {
        return Err(Status::invalid_argument(format!(
            "{} items but {} room assignments",
            items.len(),
            req.items.len()
        )));
    }
    for (i, it) in items.iter().enumerate() {
        let Some(t) = it.encoder_input.as_ref().filter(|t| !t.shape.is_empty()) else {
            return Err(Status::invalid_argument(format!(
                "item {i} has no encoder_input shape and dtype"
            )));
        };
        // The pixels must be here, exactly as many bytes as the shape and dtype say.
        let size = match t.dtype.as_str() {
            "bfloat16" | "float16" => 2,
            "float32" => 4,
            other => {
                return Err(Status::invalid_argument(format!(
                    "item {i}: unknown dtype '{other}'"
                )));
            }
        };
        let want = t
            .shape
            .iter()
            .try_fold(size, |n: u64, &d| n.checked_mul(u64::from(d)));
        let got = t.payload.as_ref().map(|p| match p {
            Payload::Inline(b) => b.len() as u64,
        });
        if got.is_none() || got != want {
            return Err(Status::invalid_argument(format!(
                "item {i}: {} pixel bytes for shape {:?} in {}",
                got.map_or("no".to_owned(), |n| n.to_string()),
                t.shape,
                t.dtype
            )));
        }
    }
    req.items
        .iter()
        .map(|a| {
            u64::try_from(a.bootstrap_room)
                .map_err(|_| Status::invalid_argument("bootstrap_room is negative"))
        })
        .collect()
}

/// Lower-case hex of a content hash.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What `/mock/stats` shows of an `Encode` request.
fn view(req: &EncodeRequest) -> Value {
    let items = req.mm_inputs.as_ref().map_or(&[][..], |m| &m.items[..]);
    let shown: Vec<Value> = items
        .iter()
        .zip(&req.items)
        .map(|(it, a)| {
            let tensor = it.encoder_input.as_ref();
            let hash = hex(&it.content_hash);
            json!({
                "content_hash": hash,
                "bootstrap_room": a.bootstrap_room,
                "modality": it.modality,
                "shape": tensor.map(|t| t.shape.clone()),
                "dtype": tensor.map(|t| t.dtype.clone()),
                "payload_bytes": tensor.and_then(|t| t.payload.as_ref()).map(|p| match p {
                    Payload::Inline(b) => b.len(),
                }),
                "model_specific_tensors": it.model_specific_tensors.iter()
                    .map(|(k, t)| (k.clone(), json!(t.shape)))
                    .collect::<serde_json::Map<_, _>>(),
                "placeholders": it.placeholders.iter()
                    .map(|p| json!([p.offset, p.length]))
                    .collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({ "request_id": req.request_id, "items": shown })
}

#[tonic::async_trait]
impl TokenSpeedEncoder for Encoder {
    async fn encode(
        &self,
        request: Request<EncodeRequest>,
    ) -> Result<Response<EncodeResponse>, Status> {
        let s = &self.shared;
        s.controls
            .record_headers(request.metadata().clone().into_headers());
        let req = request.into_inner();
        let _guard = InflightGuard::begin(s);
        let shown = view(&req);
        s.controls
            .record_decoded(Arc::new(move || Some(shown.clone())));
        let rooms = rooms(&req)?;
        s.controls.wait_while_hung().await;
        if s.controls.draw_failure() {
            return Err(Status::internal("mock injected failure"));
        }
        let delay = s.controls.delay();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        s.controls.record_encode_items(rooms.len() as u64);
        let items = req.mm_inputs.as_ref().map_or(&[][..], |m| &m.items[..]);
        // The room remembers which item's embedding it holds: the Prefill checks it against
        // the item its request names.
        for (room, item) in rooms.into_iter().zip(items) {
            s.rooms.finish_tagged(room, Some(hex(&item.content_hash)));
        }
        Ok(Response::new(EncodeResponse { accepted: true }))
    }
}

/// The standard health service of an encode worker: `SERVING` while the `healthy` control is
/// on.
#[derive(Debug)]
pub(crate) struct Health {
    pub(crate) shared: Arc<Shared>,
}

#[tonic::async_trait]
impl health::health_server::Health for Health {
    async fn check(
        &self,
        _request: Request<health::HealthCheckRequest>,
    ) -> Result<Response<health::HealthCheckResponse>, Status> {
        use health::health_check_response::ServingStatus;
        let status = if self.shared.controls.healthy() {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        Ok(Response::new(health::HealthCheckResponse {
            status: status as i32,
        }))
    }
}

#[cfg(test)]
mod tests {
    use pdrouter_proto::tokenspeed_encoder::EncodeItemAssignment;
    use pdrouter_proto::tokenspeed_scheduler::{MultimodalInputs, MultimodalItem, TensorData};

    use super::*;

    fn req(rooms: &[i64], items: usize) -> EncodeRequest {
        EncodeRequest {
            request_id: "e".to_owned(),
            mm_inputs: Some(MultimodalInputs {
                items: (0..items)
                    .map(|_| MultimodalItem {
                        content_hash: vec![0xab, 0x01],
                        encoder_input: Some(TensorData {
                            shape: vec![4, 1176],
                            dtype: "bfloat16".to_owned(),
                            payload: Some(Payload::Inline(vec![0; 4 * 1176 * 2])),
                        }),
                        ..Default::default()
                    })
                    .collect(),
            }),
            items: rooms
                .iter()
                .map(|&r| EncodeItemAssignment { bootstrap_room: r })
                .collect(),
        }
    }

    #[test]
    fn one_room_per_item_is_required() {
        assert_eq!(rooms(&req(&[1 << 40], 1)).unwrap(), vec![1 << 40]);
        assert!(rooms(&req(&[1, 2], 1)).is_err());
        assert!(rooms(&req(&[], 0)).is_err());
        assert!(rooms(&req(&[-1], 1)).is_err());
        let mut no_tensor = req(&[1], 1);
        no_tensor.mm_inputs.as_mut().unwrap().items[0].encoder_input = None;
        assert!(rooms(&no_tensor).is_err());
        let mut short = req(&[1], 1);
        short.mm_inputs.as_mut().unwrap().items[0]
            .encoder_input
            .as_mut()
            .unwrap()
            .payload = Some(Payload::Inline(vec![0; 10]));
        assert!(rooms(&short).is_err());
        let v = view(&req(&[7], 1));
        assert_eq!(v["items"][0]["content_hash"], "ab01");
        assert_eq!(v["items"][0]["shape"], json!([4, 1176]));
        assert_eq!(v["items"][0]["bootstrap_room"], 7);
    }
}
