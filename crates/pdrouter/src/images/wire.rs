//! A request's images as TokenSpeed's messages: the items of the `Generate` requests
//! (metadata only), one `Encode` request per item (with its pixels), and the per-item encode
//! tickets the Prefill gets.
//!
//! Invariants: pixels travel only in `Encode` requests — the `Generate` requests of both legs
//! carry each item's modality, content hash, placeholder range and `image_grid_thw`, and an
//! `encoder_input` with its shape and dtype but no payload; every item's room is below 2^63
//! (TokenSpeed's `int64`).

use std::sync::Arc;

use pdrouter_proto::common::Modality;
use pdrouter_proto::tokenspeed_encoder::{EncodeItemAssignment, EncodeRequest};
use pdrouter_proto::tokenspeed_scheduler::{
    EncodeBootstrapInfo, EncodeItemBootstrapInfo, MultimodalInputs, MultimodalItem,
    PlaceholderRange, TensorData, tensor_data,
};
use pdrouter_vision::Placeholder;

use super::ImageItem;
use crate::engine::{KvTicket, Runtime};

/// The name of the grid tensor Qwen2-VL's encoder reads beside the pixels.
pub const GRID_THW: &str = "image_grid_thw";

/// A request's images once its prompt is built: the items in prompt order and where each
/// one's placeholder run sits in the prompt's token ids.
#[derive(Debug)]
pub struct PromptImages {
    /// The preprocessed images.
    pub items: Vec<ImageItem>,
    /// One per item.
    pub placeholders: Vec<Placeholder>,
    /// The token each placeholder run is made of.
    pub token_id: u32,
}

/// Where one item's embedding comes from: its Encode worker's bootstrap address and the
/// item's room there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodeTicket {
    /// Index of the item in the request's `mm_inputs`.
    pub item_index: u32,
    /// The Encode worker's host and bootstrap port, and the room (below 2^63).
    pub at: KvTicket,
}

impl EncodeTicket {
    /// A ticket for item `item_index` at the Encode worker `host`/`port`, with a fresh
    /// uniformly random TokenSpeed room, in [0, 2^63).
    pub fn fresh(item_index: u32, host: &str, port: Option<u16>) -> Self {
        EncodeTicket {
            item_index,
            at: KvTicket::fresh(host, port, Runtime::TokenSpeed),
        }
    }
}

fn u32_of(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl PromptImages {
    /// Item `i` as a `MultimodalItem`, with its pixels inline when `pixels`.
    fn item(&self, i: usize, pixels: bool) -> Option<MultimodalItem> {
        let item = &self.items.get(i)?.image;
        let grid: Vec<u8> = item
            .grid_thw
            .iter()
            .flat_map(|&n| i64::from(n).to_le_bytes())
            .collect();
        let placeholders = self
            .placeholders
            .get(i)
            .map(|p| PlaceholderRange {
                offset: u32_of(p.offset),
                length: u32_of(p.length),
            })
            .into_iter()
            .collect();
        Some(MultimodalItem {
            modality: Modality::Image as i32,
            content_hash: item.hash.0.to_vec(),
            encoder_input: Some(TensorData {
                shape: item.shape.iter().map(|&n| u32_of(n)).collect(),
                dtype: item.dtype.as_str().to_owned(),
                payload: pixels.then(|| tensor_data::Payload::Inline(item.pixel_values.clone())),
            }),
            model_specific_tensors: [(
                GRID_THW.to_owned(),
                TensorData {
                    shape: vec![1, 3],
                    dtype: "int64".to_owned(),
                    payload: Some(tensor_data::Payload::Inline(grid)),
                },
            )]
            .into_iter()
            .collect(),
            placeholders,
            placeholder_token_id: Some(self.token_id),
        })
    }

    /// Every item, without pixels: what a `Generate` request carries.
    pub fn mm_inputs(&self) -> MultimodalInputs {
        MultimodalInputs {
            items: (0..self.items.len())
                .filter_map(|i| self.item(i, false))
                .collect(),
        }
    }

    /// The `Encode` request of item `i` (its pixels and its room), or `None` past the items.
    pub fn encode_request(&self, request_id: String, i: usize, room: u64) -> Option<EncodeRequest> {
        Some(EncodeRequest {
            request_id,
            mm_inputs: Some(MultimodalInputs {
                items: vec![self.item(i, true)?],
            }),
            items: vec![EncodeItemAssignment {
                bootstrap_room: i64::try_from(room).unwrap_or(i64::MAX),
            }],
        })
    }
}

/// The Prefill's `encode_bootstrap_info` for `tickets`.
pub fn encode_bootstrap_info(tickets: &[EncodeTicket]) -> EncodeBootstrapInfo {
    EncodeBootstrapInfo {
        items: tickets
            .iter()
            .map(|t| EncodeItemBootstrapInfo {
                item_index: t.item_index,
                bootstrap_host: t.at.host.clone(),
                bootstrap_port: t.at.wire_port(),
                bootstrap_room: t.at.wire_room(),
            })
            .collect(),
    }
}

/// The images of a call: the request's items, and (Prefill only) each item's ticket.
#[derive(Debug, Clone, Default)]
pub struct CallImages {
    /// The request's images, when it has any.
    pub images: Option<Arc<PromptImages>>,
    /// Where each item's embedding comes from (the Prefill leg only).
    pub encode: Vec<EncodeTicket>,
}

#[cfg(test)]
mod tests {
    use pdrouter_vision::{
        DecodeLimits, PartPath, PixelDtype, Qwen2VlConfig, VisionFamily, VisionModel,
    };

    use super::*;

    fn images() -> PromptImages {
        let model = VisionModel::new(VisionFamily::Qwen2Vl, Qwen2VlConfig::default(), 99);
        let mut png = std::io::Cursor::new(Vec::new());
        pdrouter_vision::image::RgbImage::from_pixel(
            67,
            45,
            pdrouter_vision::image::Rgb([1, 2, 3]),
        )
        .write_to(&mut png, pdrouter_vision::image::ImageFormat::Png)
        .unwrap();
        let image = model
            .process(png.get_ref(), &DecodeLimits::default(), PixelDtype::Bf16)
            .unwrap();
        PromptImages {
            items: vec![ImageItem {
                part: PartPath {
                    message: 0,
                    part: Some(1),
                },
                image,
            }],
            placeholders: vec![Placeholder {
                offset: 5,
                length: 4,
            }],
            token_id: 99,
        }
    }

    #[test]
    fn generate_items_carry_metadata_and_encode_requests_the_pixels() {
        let imgs = images();
        let mm = imgs.mm_inputs();
        let item = &mm.items[0];
        assert_eq!(item.modality, Modality::Image as i32);
        assert_eq!(item.content_hash, imgs.items[0].image.hash.0.to_vec());
        let t = item.encoder_input.as_ref().unwrap();
        assert_eq!(
            (t.shape.as_slice(), t.dtype.as_str()),
            (&[16, 1176][..], "bfloat16")
        );
        assert_eq!(t.payload, None, "no pixels in a Generate request");
        let grid = &item.model_specific_tensors[GRID_THW];
        let Some(tensor_data::Payload::Inline(g)) = &grid.payload else {
            panic!("{grid:?}")
        };
        let thw: Vec<i64> = g
            .chunks(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(thw, [1, 4, 4]);
        assert_eq!(
            (item.placeholders[0].offset, item.placeholders[0].length),
            (5, 4)
        );
        assert_eq!(item.placeholder_token_id, Some(99));

        let enc = imgs.encode_request("r".into(), 0, 1 << 62).unwrap();
        let it = &enc.mm_inputs.unwrap().items[0];
        let Some(tensor_data::Payload::Inline(px)) = &it.encoder_input.as_ref().unwrap().payload
        else {
            panic!("pixels inline")
        };
        assert_eq!(px.len(), 16 * 1176 * 2);
        assert_eq!(enc.items[0].bootstrap_room, 1 << 62);
        assert!(imgs.encode_request("r".into(), 1, 0).is_none());
    }

    #[test]
    fn rooms_are_63_bit() {
        for _ in 0..64 {
            let t = EncodeTicket::fresh(0, "h", Some(1));
            assert!(i64::try_from(t.at.room).is_ok());
        }
        let info = encode_bootstrap_info(&[EncodeTicket {
            item_index: 2,
            at: KvTicket {
                host: "e".into(),
                port: None,
                room: 7,
            },
        }]);
        let i = &info.items[0];
        assert_eq!(
            (i.item_index, i.bootstrap_port, i.bootstrap_room),
            (2, 0, 7)
        );
    }
}
