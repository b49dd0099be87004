//! [`VisionModel`]: a model directory recognised as a vision model this crate preprocesses
//! for, with its processor and its image placeholder token.
//!
//! Recognition reads `config.json`'s `model_type`: `qwen2_vl` (Qwen2-VL) and `qwen2_5_vl`
//! (Qwen2.5-VL) share one preprocessing. Anything else is not a vision model here (`None`),
//! which is not an error: a text model needs no image support.
//!
//! Two placeholder tokens, both looked up at the top level, then under `text_config`:
//! - the *image token* a chat template writes itself (Qwen2-VL's own template writes
//!   `<|image_pad|>`): `config.json`'s `image_token_id`, or `vision_token_id` when only that is
//!   present;
//! - the *anchor token* an `<image>` anchor becomes when the router places images for a
//!   template that takes string content: `vision_token_id`, as the reference router sends it,
//!   or `image_token_id` when only that is present.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::decode::decode;
use crate::error::{ImageError, LoadError};
use crate::limits::DecodeLimits;
use crate::qwen2vl::{Qwen2VlConfig, Qwen2VlProcessor};
use crate::tensor::{PixelDtype, ProcessedImage};

/// Model families this crate preprocesses for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VisionFamily {
    /// `model_type` `qwen2_vl`.
    Qwen2Vl,
    /// `model_type` `qwen2_5_vl`.
    Qwen25Vl,
}

impl VisionFamily {
    /// The family of a `config.json` `model_type`, if it is one of ours.
    pub fn from_model_type(model_type: &str) -> Option<Self> {
        match model_type {
            "qwen2_vl" => Some(VisionFamily::Qwen2Vl),
            "qwen2_5_vl" => Some(VisionFamily::Qwen25Vl),
            _ => None,
        }
    }

    /// The `model_type` naming it.
    pub fn model_type(self) -> &'static str {
        match self {
            VisionFamily::Qwen2Vl => "qwen2_vl",
            VisionFamily::Qwen25Vl => "qwen2_5_vl",
        }
    }
}

/// A vision model's image handling: decoding limits are the caller's, everything else comes
/// from the model directory.
#[derive(Debug, Clone)]
pub struct VisionModel {
    family: VisionFamily,
    processor: Qwen2VlProcessor,
    image_token_id: u32,
    anchor_token_id: u32,
}

fn read_json(file: &Path) -> Result<Option<Value>, LoadError> {
    match std::fs::read_to_string(file) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| LoadError::Read {
                file: file.to_owned(),
                detail: e.to_string(),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(LoadError::Read {
            file: file.to_owned(),
            detail: e.to_string(),
        }),
    }
}

/// The first of `keys` that `config` sets (top level first, then `text_config`).
fn token_id(config: &Value, file: &Path, keys: [&str; 2]) -> Result<u32, LoadError> {
    let scopes = [Some(config), config.get("text_config")];
    for key in keys {
        for scope in scopes.iter().flatten() {
            if let Some(v) = scope.get(key).filter(|v| !v.is_null()) {
                return v
                    .as_u64()
                    .and_then(|id| u32::try_from(id).ok())
                    .ok_or_else(|| LoadError::Unsupported {
                        file: file.to_owned(),
                        detail: format!("{key} must be a token id, got {v}"),
                    });
            }
        }
    }
    Err(LoadError::Unsupported {
        file: file.to_owned(),
        detail: "a vision model's config needs image_token_id or vision_token_id".into(),
    })
}

impl VisionModel {
    /// Recognises the model in `dir` (the model or tokenizer directory): `None` when
    /// `config.json` is absent or names another `model_type`.
    pub fn load(dir: &Path) -> Result<Option<Self>, LoadError> {
        let file: PathBuf = dir.join("config.json");
        let Some(config) = read_json(&file)? else {
            return Ok(None);
        };
        let Some(family) = config
            .get("model_type")
            .and_then(Value::as_str)
            .and_then(VisionFamily::from_model_type)
        else {
            return Ok(None);
        };
        let image_token_id = token_id(&config, &file, ["image_token_id", "vision_token_id"])?;
        let anchor_token_id = token_id(&config, &file, ["vision_token_id", "image_token_id"])?;
        let processor = Qwen2VlProcessor::new(Qwen2VlConfig::load(dir)?);
        Ok(Some(VisionModel {
            family,
            processor,
            image_token_id,
            anchor_token_id,
        }))
    }

    /// A model from its parts (tests, and callers that configure it in code), one token for
    /// both placements.
    pub fn new(family: VisionFamily, config: Qwen2VlConfig, image_token_id: u32) -> Self {
        VisionModel {
            family,
            processor: Qwen2VlProcessor::new(config),
            image_token_id,
            anchor_token_id: image_token_id,
        }
    }

    /// Its family.
    pub fn family(&self) -> VisionFamily {
        self.family
    }

    /// Its preprocessing.
    pub fn processor(&self) -> &Qwen2VlProcessor {
        &self.processor
    }

    /// The image token a chat template writes itself; its one copy per image is expanded to
    /// the image's placeholder run.
    pub fn image_token_id(&self) -> u32 {
        self.image_token_id
    }

    /// The token an `<image>` anchor's placeholder run is made of, when the router places the
    /// images (templates that take string content).
    pub fn anchor_token_id(&self) -> u32 {
        self.anchor_token_id
    }

    /// Encoded bytes to the tensor the encoder takes: decode (within `limits`), resize,
    /// normalise, patchify. CPU-bound; callers on an async runtime run it off the reactor.
    pub fn process(
        &self,
        bytes: &[u8],
        limits: &DecodeLimits,
        dtype: PixelDtype,
    ) -> Result<ProcessedImage, ImageError> {
        let rgb = decode(bytes, limits)?;
        self.processor.process(&rgb, dtype)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir_with(config: &str, preprocessor: Option<&str>) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), config).unwrap();
        if let Some(p) = preprocessor {
            std::fs::write(dir.path().join("preprocessor_config.json"), p).unwrap();
        }
        dir
    }

    #[test]
    fn recognises_the_qwen_vl_family_and_reads_its_settings() {
        let dir = dir_with(
            r#"{"model_type": "qwen2_vl", "vision_token_id": 151654, "image_token_id": 151655}"#,
            Some(r#"{"min_pixels": 3136, "max_pixels": 12845056}"#),
        );
        let m = VisionModel::load(dir.path()).unwrap().unwrap();
        assert_eq!(m.family(), VisionFamily::Qwen2Vl);
        assert_eq!(m.image_token_id(), 151655);
        assert_eq!(m.anchor_token_id(), 151654);
        assert_eq!(m.processor().config().max_pixels, 12_845_056);

        let dir = dir_with(
            r#"{"model_type": "qwen2_5_vl", "text_config": {"vision_token_id": 7}}"#,
            None,
        );
        let m = VisionModel::load(dir.path()).unwrap().unwrap();
        assert_eq!(m.family(), VisionFamily::Qwen25Vl);
        assert_eq!(m.image_token_id(), 7);
        assert_eq!(m.anchor_token_id(), 7);
        assert_eq!(m.processor().config(), &Qwen2VlConfig::default());

        let only_image = dir_with(r#"{"model_type": "qwen2_vl", "image_token_id": 9}"#, None);
        let m = VisionModel::load(only_image.path()).unwrap().unwrap();
        assert_eq!((m.image_token_id(), m.anchor_token_id()), (9, 9));
    }

    #[test]
    fn other_models_are_not_vision_models_and_broken_ones_are_errors() {
        let text = dir_with(r#"{"model_type": "qwen3"}"#, None);
        assert!(VisionModel::load(text.path()).unwrap().is_none());
        let empty = tempfile::tempdir().unwrap();
        assert!(VisionModel::load(empty.path()).unwrap().is_none());

        let no_token = dir_with(r#"{"model_type": "qwen2_vl"}"#, None);
        assert!(VisionModel::load(no_token.path()).is_err());
        let bad_token = dir_with(r#"{"model_type": "qwen2_vl", "image_token_id": -1}"#, None);
        assert!(VisionModel::load(bad_token.path()).is_err());
        let bad_pre = dir_with(
            r#"{"model_type": "qwen2_vl", "image_token_id": 1}"#,
            Some(r#"{"resample": 0}"#),
        );
        let err = VisionModel::load(bad_pre.path()).unwrap_err();
        assert!(err.to_string().contains("resample"), "{err}");
        let garbage = dir_with("{", None);
        assert!(VisionModel::load(garbage.path()).is_err());
    }
}
