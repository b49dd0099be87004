//! `pdrouter demo` flags: where the demo router listens, whether it shows a burst, and which
//! mocks (HTTP, gRPC or EPD) it starts.

use std::net::IpAddr;

use clap::Args;

/// `pdrouter demo` flags.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Address the demo router listens on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// Port of the demo router (0 = any free port).
    #[arg(long, default_value_t = 30000)]
    pub port: u16,
    /// Send a short burst through the router at start and show admission at work.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub burst: bool,
    /// Run the mocks as gRPC workers: the router tokenizes (with the tokenizer the mocks
    /// serve) and speaks SGLang's scheduler protocol to them.
    #[arg(long)]
    pub grpc: bool,
    /// Run EPD: an embedded TokenSpeed Encode mock besides the Prefill and Decode ones, and a
    /// router serving images for a small Qwen2-VL-shaped model (the mocks' byte-level
    /// tokenizer).
    #[arg(long, conflicts_with = "grpc")]
    pub epd: bool,
    /// Run the mocks as vLLM servers with the NIXL connector: the router sends each Prefill
    /// leg first, capped at one token, and relays its KV transfer params to Decode.
    #[arg(long, conflicts_with_all = ["grpc", "epd"])]
    pub vllm: bool,
}
