//! Compiles the .proto files with protox (pure Rust), so building needs no
//! system `protoc`, then generates prost messages and tonic client/server.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/common.proto",
        "proto/sglang_scheduler.proto",
        "proto/tokenspeed_scheduler.proto",
        "proto/tokenspeed_encoder.proto",
        "proto/vllm_engine.proto",
        "proto/grpc_health.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
