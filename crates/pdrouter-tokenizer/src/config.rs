//! The model files beside `tokenizer.json`: `tokenizer_config.json` (and
//! `special_tokens_map.json` for special tokens it lacks), `generation_config.json`,
//! `config.json`, `chat_template.jinja`/`chat_template.json`, and explicit template files.
//!
//! Only the fields the router uses are read; unknown fields are ignored, a field of the wrong
//! shape is an error naming the file (a model directory the router cannot understand must not
//! start serving with a silently different prompt format).

use std::fs;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::LoadError;

/// `tokenizer_config.json`, the fields the router uses.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct TokenizerConfig {
    #[serde(default)]
    pub(crate) bos_token: Option<TokenSpec>,
    #[serde(default)]
    pub(crate) eos_token: Option<TokenSpec>,
    #[serde(default)]
    pub(crate) pad_token: Option<TokenSpec>,
    #[serde(default)]
    pub(crate) unk_token: Option<TokenSpec>,
    #[serde(default)]
    pub(crate) sep_token: Option<TokenSpec>,
    #[serde(default)]
    pub(crate) cls_token: Option<TokenSpec>,
    #[serde(default)]
    pub(crate) mask_token: Option<TokenSpec>,
    #[serde(default)]
    pub(crate) chat_template: Option<TemplateSpec>,
}

impl TokenizerConfig {
    /// Takes the special tokens `self` lacks from `map` (`special_tokens_map.json`, which HF
    /// reads too and which older models use instead).
    fn fill_special_tokens(&mut self, map: TokenizerConfig) {
        let pairs = [
            (&mut self.bos_token, map.bos_token),
            (&mut self.eos_token, map.eos_token),
            (&mut self.pad_token, map.pad_token),
            (&mut self.unk_token, map.unk_token),
            (&mut self.sep_token, map.sep_token),
            (&mut self.cls_token, map.cls_token),
            (&mut self.mask_token, map.mask_token),
        ];
        for (mine, theirs) in pairs {
            if mine.is_none() {
                *mine = theirs;
            }
        }
    }

    /// The special tokens a chat template sees by name (`bos_token`, `eos_token`, ...), as HF
    /// passes its special tokens map: only those that are set.
    pub(crate) fn special_tokens(&self) -> Vec<(&'static str, String)> {
        let named = [
            ("bos_token", &self.bos_token),
            ("eos_token", &self.eos_token),
            ("unk_token", &self.unk_token),
            ("sep_token", &self.sep_token),
            ("pad_token", &self.pad_token),
            ("cls_token", &self.cls_token),
            ("mask_token", &self.mask_token),
        ];
        named
            .into_iter()
            .filter_map(|(name, spec)| Some((name, spec.as_ref()?.content().to_owned())))
            .collect()
    }
}

/// A special token, written either as its text or as an `AddedToken` object.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum TokenSpec {
    Text(String),
    Added { content: String },
}

impl TokenSpec {
    pub(crate) fn content(&self) -> &str {
        match self {
            TokenSpec::Text(s) | TokenSpec::Added { content: s } => s,
        }
    }
}

/// A `chat_template` field: one template, or named templates of which "default" is used.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum TemplateSpec {
    One(String),
    Named(Vec<NamedTemplate>),
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct NamedTemplate {
    name: String,
    template: String,
}

impl TemplateSpec {
    /// The template source, or an error naming the choices when there is no "default".
    fn pick(self, file: &Path) -> Result<String, LoadError> {
        match self {
            TemplateSpec::One(source) => Ok(source),
            TemplateSpec::Named(list) => {
                let names: Vec<String> = list.iter().map(|t| t.name.clone()).collect();
                list.into_iter()
                    .find(|t| t.name == "default")
                    .map(|t| t.template)
                    .ok_or_else(|| LoadError::NoDefaultTemplate {
                        file: file.to_owned(),
                        names,
                    })
            }
        }
    }
}

/// `eos_token_id` in `generation_config.json` or `config.json`: one id or a list.
#[derive(Debug, Default, Deserialize)]
struct EosIds {
    #[serde(default)]
    eos_token_id: Option<OneOrMany>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(u32),
    Many(Vec<u32>),
}

/// `{"chat_template": ...}`, the shape of `chat_template.json` and of a JSON `--chat-template`.
#[derive(Debug, Deserialize)]
struct TemplateFile {
    chat_template: TemplateSpec,
}

/// Reads and parses a JSON file; `Ok(None)` when it does not exist.
fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Option<T>, LoadError> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(LoadError::Io {
                path: path.to_owned(),
                source,
            });
        }
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| LoadError::Config {
            path: path.to_owned(),
            detail: e.to_string(),
        })
}

fn read_text(path: &Path) -> Result<Option<String>, LoadError> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(LoadError::Io {
            path: path.to_owned(),
            source,
        }),
    }
}

/// What a model directory says besides `tokenizer.json`.
#[derive(Debug, Default)]
pub(crate) struct ModelFiles {
    pub(crate) tokenizer_config: TokenizerConfig,
    /// `generation_config.json` first, then `config.json`, in file order.
    pub(crate) eos_token_ids: Vec<u32>,
    /// The template found in the directory, with the file it came from.
    pub(crate) chat_template: Option<(String, PathBuf)>,
}

impl ModelFiles {
    /// Reads the optional files of `dir`; a missing file is no error, a malformed one is.
    pub(crate) fn read(dir: &Path) -> Result<Self, LoadError> {
        let config_path = dir.join("tokenizer_config.json");
        let mut tokenizer_config: TokenizerConfig = read_json(&config_path)?.unwrap_or_default();
        if let Some(map) = read_json(&dir.join("special_tokens_map.json"))? {
            tokenizer_config.fill_special_tokens(map);
        }
        let mut eos_token_ids = Vec::new();
        for name in ["generation_config.json", "config.json"] {
            let ids: Option<EosIds> = read_json(&dir.join(name))?;
            match ids.and_then(|ids| ids.eos_token_id) {
                Some(OneOrMany::One(id)) => eos_token_ids.push(id),
                Some(OneOrMany::Many(ids)) => eos_token_ids.extend(ids),
                None => {}
            }
        }
        let chat_template = match tokenizer_config.chat_template.take() {
            Some(spec) => Some((spec.pick(&config_path)?, config_path)),
            None => dir_template(dir)?,
        };
        Ok(ModelFiles {
            tokenizer_config,
            eos_token_ids,
            chat_template,
        })
    }
}

/// `chat_template.jinja`, else `chat_template.json`, in `dir`.
fn dir_template(dir: &Path) -> Result<Option<(String, PathBuf)>, LoadError> {
    let jinja = dir.join("chat_template.jinja");
    if let Some(source) = read_text(&jinja)? {
        return Ok(Some((source, jinja)));
    }
    let json = dir.join("chat_template.json");
    match read_json::<TemplateFile>(&json)? {
        Some(file) => Ok(Some((file.chat_template.pick(&json)?, json))),
        None => Ok(None),
    }
}

/// An explicit template file: a JSON object with `chat_template` when the name ends in
/// `.json`, otherwise the template source itself.
pub(crate) fn template_file(path: &Path) -> Result<String, LoadError> {
    let missing = || LoadError::Io {
        path: path.to_owned(),
        source: std::io::Error::from(std::io::ErrorKind::NotFound),
    };
    if path
        .extension()
        .is_some_and(|ext| ext.eq_ignore_ascii_case("json"))
    {
        let file: TemplateFile = read_json(path)?.ok_or_else(missing)?;
        file.chat_template.pick(path)
    } else {
        read_text(path)?.ok_or_else(missing)
    }
}
